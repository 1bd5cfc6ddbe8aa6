"""vLLM's prefix-caching scenarios on the cache manager, driven by hand (no model): what is found, what is
held, what is published and when, and what a failed allocation leaves behind. The lookup's and the publication's
tests run that body alone, the chapter's others as their stand-ins (stand_in.py)."""
from __future__ import annotations

import pytest

from step02_paged import PrefixMatch
from step02_paged.geometry import PoolGeometry
from step03_prefix_hash import PrefixCachingKVCacheManager
from step03_prefix_hash.pictures import hash_tree_dot, hash_tree_text

from .helpers import admit, compute, hseq, prefilled, snapshot
from .stand_in import STAND_INS

BS = 4


def kv_with(num_blocks: int = 16) -> PrefixCachingKVCacheManager:
    return PrefixCachingKVCacheManager(PoolGeometry(num_blocks, BS))


@pytest.mark.task("task3.lookup")
@pytest.mark.usefixtures("alone")
def test_hit_raises_ref_count_to_two():
    kv = kv_with()
    a = prefilled(kv, 0, list(range(10)))
    b = hseq(1, list(range(8)) + [50, 51, 52])
    assert admit(kv, b) == 8
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [kv.block_manager.ref_count[x] for x in b.block_table] == [2, 2, 1]
    assert b.num_computed_tokens == b.num_cached_tokens == 8
    kv.check_invariants()
    kv.free(a)
    assert [kv.block_manager.ref_count[x] for x in b.block_table] == [1, 1, 1]
    kv.free(b)
    assert sum(kv.block_manager.ref_count) == 0 and kv.block_manager.num_cached == 2
    kv.check_invariants()


@pytest.mark.task("task3.publish")
@pytest.mark.usefixtures("alone")
def test_partial_block_is_not_cached():
    kv = kv_with()
    a = hseq(0, list(range(10)))  # 2 full blocks + 2 tokens
    admit(kv, a)
    compute(kv, a)
    bm = kv.block_manager
    assert bm.num_cached == 2 and bm.entries[a.block_table[2]] is None
    b = hseq(1, list(range(11)))  # shares all 10 tokens, but only 8 of them sit in full blocks
    assert admit(kv, b) == 8
    kv.check_invariants()


@pytest.mark.task("task3.publish")
@pytest.mark.usefixtures("alone")
def test_blocks_are_published_only_once_computed():
    kv = kv_with()
    a = hseq(0, list(range(12)))
    admit(kv, a)
    compute(kv, a, upto=6)  # a first prefill chunk: one full block computed
    assert kv.block_manager.num_cached == 1
    assert kv.get_computed_blocks(hseq(1, list(range(12)))).num_tokens == 4
    compute(kv, a, upto=12)
    assert kv.block_manager.num_cached == 3
    kv.check_invariants()


@pytest.mark.task("task3.publish")
@pytest.mark.usefixtures("alone")
def test_block_filled_during_decode_becomes_cached():
    kv = kv_with()
    a = prefilled(kv, 0, list(range(6)))
    assert kv.block_manager.num_cached == 1
    for t in (100, 101):  # decode: sample a token, run it next step
        a.append_token(t)
        assert kv.allocate_slots(a, 1)
        compute(kv, a)
    block = kv.block_manager.entries[a.block_table[1]]
    assert block is not None and block.token_ids == (4, 5, 100, 101)
    kv.free(a)
    b = hseq(1, list(range(6)) + [100, 101, 7])
    assert admit(kv, b) == 8, "the generated tokens' block is reused"
    kv.check_invariants()


@pytest.mark.task("task3.lookup")
@pytest.mark.usefixtures("alone")
def test_full_hit_prompt_still_computes_its_last_token():
    kv = kv_with()
    prefilled(kv, 0, list(range(8)))
    assert kv.block_manager.num_cached == 2
    same = hseq(1, list(range(8)))
    match = kv.get_computed_blocks(same)
    assert match.num_tokens == 4 and len(match.blocks) == 1, "8 cached, at most 7 may hit: whole blocks only -> 4"
    assert kv.get_computed_blocks(hseq(2, list(range(9)))).num_tokens == 8, "one more token: both blocks hit"
    admit(kv, same)
    assert same.num_pending_tokens == 4
    kv.check_invariants()


@pytest.mark.task("task3.lookup")
@pytest.mark.usefixtures("alone")
def test_lookup_stops_at_the_first_miss():
    kv = kv_with()
    a = prefilled(kv, 0, list(range(12)))
    b = hseq(1, [0, 1, 2, 3, 99, 5, 6, 7, 8, 9, 10, 11, 12])  # block 1 differs, so block 2 differs too
    assert kv.get_computed_blocks(b) == PrefixMatch((a.block_table[0],), 4)


@pytest.mark.task("task3.lookup")
@pytest.mark.usefixtures("alone")
def test_other_salt_never_hits():
    kv = kv_with()
    prefilled(kv, 0, list(range(9)), salt="alice")
    assert kv.get_computed_blocks(hseq(1, list(range(9)), salt="bob")).num_tokens == 0
    assert kv.get_computed_blocks(hseq(2, list(range(9)))).num_tokens == 0
    assert kv.get_computed_blocks(hseq(3, list(range(9)), salt="alice")).num_tokens == 8


@pytest.mark.task("task3.lookup")
@pytest.mark.usefixtures("alone")
def test_touched_hit_leaves_the_free_queue():
    kv = kv_with(6)
    a = prefilled(kv, 0, list(range(9)))
    hits = a.block_table[:2]
    kv.free(a)
    bm = kv.block_manager
    assert all(x in bm.free_blocks and bm.ref_count[x] == 0 for x in hits), "freed, still cached"
    b = hseq(1, list(range(9)))
    admit(kv, b)
    assert b.block_table[:2] == hits
    assert all(x not in bm.free_blocks and bm.ref_count[x] == 1 for x in hits)
    kv.check_invariants()


@pytest.mark.task("task3.lookup")
@pytest.mark.usefixtures("alone")
def test_a_hit_is_never_evicted_by_its_own_allocation():
    """The hits sit at the front of the free queue; the new block must come from behind them."""
    kv = kv_with(4)
    a = hseq(0, list(range(8)))  # blocks 0, 1
    admit(kv, a)
    compute(kv, a)
    e, f = hseq(1, [90, 91, 92]), hseq(2, [80, 81, 82])  # blocks 2, 3
    admit(kv, e)
    admit(kv, f)
    kv.free(a)
    kv.free(e)
    assert list(kv.block_manager.free_blocks) == [1, 0, 2]
    b = hseq(3, list(range(8)) + [5])  # hits 0, 1 and needs one new block
    assert admit(kv, b) == 8
    assert b.block_table == [0, 1, 2] and kv.block_manager.num_cached == 2
    kv.check_invariants()


@pytest.mark.task("task3.lookup")
@pytest.mark.usefixtures("alone")
def test_failed_allocation_leaves_ref_counts_unchanged():
    kv = kv_with(4)
    a = prefilled(kv, 0, list(range(12)))
    kv.free(a)  # 3 cached free blocks + 1 never used
    held = hseq(1, [200])
    admit(kv, held)  # takes block 3, the front of the queue [3, 2, 1, 0]: 3 blocks stay free
    b = hseq(2, list(range(8)) + list(range(50, 58)))  # 2 hits + 2 new blocks: needs 4, only 3 free
    match = kv.get_computed_blocks(b)
    assert match.num_tokens == 8
    before = snapshot(kv)
    assert not kv.allocate_slots(b, b.num_tokens - match.num_tokens, match)
    assert snapshot(kv) == before and b.block_table == [] and b.num_computed_tokens == 0
    kv.check_invariants()


def test_reset_only_when_idle():
    kv = kv_with()
    a = prefilled(kv, 0, list(range(9)))
    before = snapshot(kv)
    with pytest.raises(RuntimeError, match="hold blocks"):
        kv.reset_cache()
    assert snapshot(kv) == before
    kv.free(a)
    assert kv.reset_cache() == 2
    assert kv.get_computed_blocks(hseq(1, list(range(9)))) == PrefixMatch()
    kv.check_invariants()


def test_stats_count_each_request_once():
    kv = kv_with()
    for i in range(3):
        s = hseq(i, list(range(9)))
        admit(kv, s)
        compute(kv, s)
        kv.free(s)
    st = kv.stats
    assert (st.requests, st.hit_requests, st.queried_tokens, st.hit_tokens) == (3, 2, 27, 16)
    assert [r[2] for r in st.recent] == [0, 8, 8]


def test_a_preempted_request_is_counted_once():
    """Re-admitted after a preemption, a request finds its own computed blocks: that is no prompt hit, and the
    request is not a second query."""
    kv = kv_with()
    prefilled(kv, 0, list(range(9)))
    s = hseq(1, list(range(9)))
    assert admit(kv, s) == 8
    kv.free(s)  # what the scheduler's preemption does
    s.preempt()
    admit(kv, s)
    assert (kv.stats.requests, kv.stats.hit_tokens, s.num_cached_tokens) == (2, 8, 8)


def test_invariants_catch_a_block_at_the_wrong_position():
    kv = kv_with()
    a = prefilled(kv, 0, list(range(8)))
    a.block_table.reverse()  # the table now lists block 1's content at position 0
    with pytest.raises(AssertionError, match="content differs"):
        kv.check_invariants()


def test_a_duplicate_parent_can_leave_an_unreachable_orphan():
    """Tail-first freeing keeps every cached parent behind its children in the free queue — except when a
    request computed its own private copy of the parent (admitted in the same step as the first copy)."""
    kv = kv_with(6)
    a = hseq(0, [1, 1, 1, 1, 5])
    b = hseq(1, [1, 1, 1, 1, 2, 2, 2, 2, 9])
    admit(kv, a)
    admit(kv, b)  # admitted together: neither finds the other's first block
    compute(kv, a)
    compute(kv, b)
    bm = kv.block_manager
    a0, (b0, b1) = a.block_table[0], b.block_table[:2]
    assert bm.entries[a0] is not None and bm.entries[b0] is None, "the second copy stays private"
    assert bm.entries[b1].parent == bm.entries[a0].block_hash, "b's second block hangs under a's first"
    kv.free(a)
    kv.free(b)
    kv.check_invariants()
    taken = bm.allocate(list(bm.free_blocks).index(a0) + 1)  # the allocator reaches a's first block
    assert a0 in taken and bm.entries[b1] is not None
    assert kv.get_computed_blocks(hseq(2, [1, 1, 1, 1, 2, 2, 2, 2, 9])) == PrefixMatch(), "cached, yet unreachable"
    assert "(parent evicted) block" in hash_tree_text(kv) and "evicted" in hash_tree_dot(kv)


def test_every_task_of_the_chapter_has_a_stand_in():
    """`alone` (conftest.py) runs every body of the chapter but the test's own as its stand-in: a task without one
    would leave its stub in the way of the others' tests."""
    from course.homework_tool import find_tasks

    assert set(STAND_INS) == set(find_tasks("step03_prefix_hash"))
