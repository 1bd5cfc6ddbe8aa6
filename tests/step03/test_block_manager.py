"""PrefixCachingBlockManager: freed blocks stay cached in LRU order; reuse evicts; touch revives. The tests of
task3.touch_evict run it alone: the chapter's free queue and hash as their stand-ins (stand_in.py)."""
from __future__ import annotations

import pytest

from step02_paged.block_manager import OutOfBlocksError
from step03_prefix_hash import block_hash
from step03_prefix_hash.block_manager import CacheEntry, PrefixCachingBlockManager


def entry(tokens, parent=None) -> CacheEntry:
    return CacheEntry(block_hash.hash_block_tokens(parent, tokens), parent, tuple(tokens))  # a stand-in's, alone


def state(bm):
    return list(bm.ref_count), list(bm.free_blocks), dict(bm.cached)


def publish_and_free(bm, order):
    """Allocate one block per id in `order`'s length, publish each, then free them in `order`."""
    blocks = bm.allocate(len(order))
    entries = {b: entry([b] * 4) for b in blocks}
    for b in blocks:
        assert bm.cache_block(b, entries[b])
    for b in order:
        bm.release([b])
    return entries


@pytest.mark.task("task3.touch_evict")
@pytest.mark.usefixtures("alone")
def test_lru_eviction_order_and_hash_dropped_on_reuse():
    bm = PrefixCachingBlockManager(4)
    entries = publish_and_free(bm, [2, 0, 3, 1])
    assert list(bm.free_blocks) == [2, 0, 3, 1] and bm.num_cached == 4
    assert all(bm.get_cached_block(e.block_hash) == b for b, e in entries.items()), "freeing must not forget"
    [b] = bm.allocate(1)
    assert b == 2, "the least recently freed block is reused first"
    assert bm.get_cached_block(entries[2].block_hash) is None and bm.entries[2] is None
    assert bm.num_evicted == 1 and bm.num_cached == 3
    assert bm.allocate(2) == [0, 3]
    assert bm.get_cached_block(entries[1].block_hash) == 1, "the most recently freed block is still cached"
    bm.check_invariants()


@pytest.mark.task("task3.touch_evict")
@pytest.mark.usefixtures("alone")
def test_touched_hit_leaves_the_free_queue_and_survives_allocation():
    bm = PrefixCachingBlockManager(3)
    entries = publish_and_free(bm, [0, 1, 2])
    bm.touch([0])  # a hit on the block at the front of the queue
    assert bm.ref_count[0] == 1 and 0 not in bm.free_blocks
    assert bm.allocate(2) == [1, 2]
    assert bm.get_cached_block(entries[0].block_hash) == 0
    with pytest.raises(OutOfBlocksError):
        bm.allocate(1)
    bm.touch([0])  # a hit on a block already in use: just one more holder
    assert bm.ref_count[0] == 2
    bm.check_invariants()


@pytest.mark.task("task3.touch_evict")
@pytest.mark.usefixtures("alone")
def test_released_cached_block_goes_to_the_back_and_stays_findable():
    bm = PrefixCachingBlockManager(3)
    entries = publish_and_free(bm, [0, 1])
    bm.touch([0])
    bm.release([0])
    assert list(bm.free_blocks)[-1] == 0 and bm.get_cached_block(entries[0].block_hash) == 0
    assert bm.allocate(2) == [2, 1]
    bm.check_invariants()


def test_touching_a_free_uncached_block_is_refused_and_changes_nothing():
    bm = PrefixCachingBlockManager(3)
    publish_and_free(bm, [0])
    before = state(bm)
    with pytest.raises(ValueError, match="not cached"):
        bm.touch([0, 1])  # 0 is fine, 1 holds nothing: nothing may change
    assert state(bm) == before


def test_duplicate_content_keeps_the_first_block():
    bm = PrefixCachingBlockManager(3)
    a, b = bm.allocate(2)
    e = entry([1, 2, 3, 4])
    assert bm.cache_block(a, e)
    assert not bm.cache_block(b, e), "the second copy stays private"
    assert bm.get_cached_block(e.block_hash) == a and bm.entries[b] is None
    assert bm.cache_block(a, e), "publishing the same block twice is harmless"
    with pytest.raises(ValueError, match="other content"):
        bm.cache_block(a, entry([9, 9, 9, 9]))
    bm.release([a, b])
    with pytest.raises(ValueError, match="free"):
        bm.cache_block(b, entry([5, 5, 5, 5]))
    bm.check_invariants()


def test_reset_only_when_idle():
    bm = PrefixCachingBlockManager(3)
    entries = publish_and_free(bm, [0, 1])
    bm.touch([1])
    before = state(bm)
    with pytest.raises(RuntimeError, match="held"):
        bm.reset()
    assert state(bm) == before
    bm.release([1])
    assert bm.reset() == 2
    assert bm.num_cached == 0 and all(bm.get_cached_block(e.block_hash) is None for e in entries.values())
    assert sorted(bm.free_blocks) == [0, 1, 2]
    bm.check_invariants()


def test_invariants_catch_a_corrupted_map():
    bm = PrefixCachingBlockManager(2)
    publish_and_free(bm, [0, 1])
    bm.cached[next(iter(bm.cached))] = 1  # two hashes now claim block 1
    with pytest.raises(AssertionError, match="maps to block"):
        bm.check_invariants()
