"""The cache manager by hand, no model: SGLang's ownership model step by step. Every slot has one owner (the
tree, one request, or the free list); sharing a prefix is a lock on a node, never a count on a slot; an
insert that finds tokens already cached frees the request's duplicates and points its table at the tree."""
from __future__ import annotations

import pytest

from step01_kvcache.generate import SamplingParams
from step02_paged.geometry import PoolGeometry
from step02_paged.scheduler import admit as admit_after_match
from step04_radix import RadixKVCacheManager, RadixSequence, TreeMatch


def admit(kv: RadixKVCacheManager, seq: RadixSequence) -> int:
    """What the scheduler does: match, then allocate the rest; returns the number of cached tokens."""
    match = kv.get_computed_blocks(seq)
    assert kv.allocate_slots(seq, seq.num_tokens - match.num_tokens, match)
    admit_after_match(kv, seq, match)
    return match.num_tokens


def compute(kv: RadixKVCacheManager, seq: RadixSequence, n: int) -> None:
    """What a forward does to the bookkeeping: n more tokens have K/V, then the manager is told."""
    seq.advance(n)
    kv.on_computed(seq)
    kv.check_invariants()


def seq(i: int, tokens: list[int]) -> RadixSequence:
    return RadixSequence(i, tokens, SamplingParams(max_new_tokens=4))


def test_a_shared_prefix_is_a_lock_not_a_count():
    kv = RadixKVCacheManager(PoolGeometry(32, 1))
    a = seq(0, [1, 2, 3, 4, 5, 6])
    assert admit(kv, a) == 0
    compute(kv, a, 6)  # prefill done: all 6 tokens now belong to the tree, a locks them
    assert a.cache_protected_len == 6 and kv.private_blocks(a) == []
    assert kv.tree.protected_size == 6 and kv.block_manager.num_free == 26

    b = seq(1, [1, 2, 3, 9, 9])
    assert admit(kv, b) == 3  # the match splits a's edge after [1, 2, 3]
    assert b.block_table[:3] == a.block_table[:3] and len(kv.private_blocks(b)) == 2
    assert all(kv.block_manager.ref_count[s] == 1 for s in b.block_table[:3]), "no extra count for sharing"
    assert [n.lock_ref for n in kv.tree.nodes()] == [2, 1], "[1,2,3] is locked by a and b, [4,5,6] by a"
    kv.check_invariants()
    compute(kv, b, 2)
    assert kv.block_manager.num_free == 24

    kv.free(a)  # a finishes: it unlocks; its tokens stay cached, evictable
    kv.check_invariants()
    assert kv.tree.evictable_size == 3 and kv.tree.protected_size == 5
    kv.free(b)
    kv.check_invariants()
    assert kv.tree.protected_size == 0 and kv.tree.total_size == 8 and kv.block_manager.num_free == 24
    assert kv.evict(100) == 8 and kv.block_manager.num_free == 32
    kv.check_invariants()


def test_duplicates_are_freed_and_the_table_points_at_the_tree():
    """Two requests with the same prompt admitted together: both compute it; the second insert finds it."""
    kv = RadixKVCacheManager(PoolGeometry(32, 1))
    a, b = seq(0, [7, 8, 9, 10]), seq(1, [7, 8, 9, 10, 11])
    assert admit(kv, a) == 0 and admit(kv, b) == 0  # nothing cached yet
    b_own = list(b.block_table)
    compute(kv, a, 4)
    free_before = kv.block_manager.num_free
    compute(kv, b, 5)
    assert kv.block_manager.num_free == free_before + 4, "b's 4 duplicate slots went back to the free list"
    assert b.block_table[:4] == a.block_table[:4] and b.block_table[4] == b_own[4]
    assert kv.tree.total_size == 5 and b.cache_protected_len == 5
    for s in (a, b):
        kv.free(s)
        kv.check_invariants()


def test_allocation_failure_unlocks_and_changes_no_table():
    kv = RadixKVCacheManager(PoolGeometry(8, 1))
    a = seq(0, [1, 2, 3, 4, 5, 6])
    admit(kv, a)
    compute(kv, a, 6)
    big = seq(1, [1, 2, 3] + list(range(20, 26)))  # needs 3 cached + 6 new, but only 2 slots are free
    match = kv.get_computed_blocks(big)
    assert not kv.allocate_slots(big, big.num_tokens - match.num_tokens, match)
    assert big.block_table == [] and big.last_node is None and 1 not in kv.holders
    assert [n.lock_ref for n in kv.tree.nodes()] == [1, 1], "the failed admission left no lock behind"
    kv.check_invariants()
    forged = TreeMatch((0, 1, 7), 3, kv.get_computed_blocks(big).node)  # not the tree's slots for this prefix
    with pytest.raises(ValueError, match="get_computed_blocks"):
        kv.allocate_slots(big, 6, forged)


def test_eviction_makes_room_but_spares_the_matched_prefix():
    kv = RadixKVCacheManager(PoolGeometry(12, 1))
    for i, tokens in enumerate(([1, 2, 3, 4], [5, 6, 7, 8])):
        s = seq(i, tokens)
        admit(kv, s)
        compute(kv, s, 4)
        kv.free(s)  # 8 slots cached, 4 free
    c = seq(2, [1, 2, 3, 9, 9, 9, 9, 9])  # reuses [1, 2, 3], needs 5 new slots: one eviction
    assert admit(kv, c) == 3
    assert kv.num_evicted == 4 and kv.tree.match_prefix([5])[0] == [], "the LRU leaf [5..8] went"
    assert c.block_table[:3] == kv.tree.match_prefix([1, 2, 3])[0], "the matched prefix was locked first"
    kv.check_invariants()


def test_a_stale_match_is_refused_and_changes_nothing():
    """Look up A; another admission evicts A's matched node; allocating A with the old match is refused."""
    kv = RadixKVCacheManager(PoolGeometry(8, 1))
    old = seq(0, [1, 2, 3, 4, 5])
    admit(kv, old)
    compute(kv, old, 5)
    kv.free(old)  # [1..5] cached, unlocked
    a = seq(1, [1, 2, 3, 4, 9])
    match = kv.get_computed_blocks(a)
    assert match.num_tokens == 4
    b = seq(2, [7] * 8)
    assert admit(kv, b) == 0, "b needs every slot: the whole tree is evicted, a's node with it"
    assert not kv.tree.contains(match.node)
    before = (list(kv.block_manager.ref_count), [n.lock_ref for n in kv.tree.nodes()], dict(kv.holders))
    with pytest.raises(ValueError, match="stale match"):
        kv.allocate_slots(a, 1, match)
    assert (list(kv.block_manager.ref_count), [n.lock_ref for n in kv.tree.nodes()], dict(kv.holders)) == before
    assert a.block_table == [] and a.last_node is None
    kv.check_invariants()


def test_a_preempted_request_is_counted_once():
    """Re-admitted after a preemption, a request finds its own computed tokens: no prompt hit, no new admission."""
    kv = RadixKVCacheManager(PoolGeometry(32, 1))
    first = seq(0, [1, 2, 3, 4])
    admit(kv, first)
    compute(kv, first, 4)
    kv.free(first)
    s = seq(1, [1, 2, 3, 4, 5, 6])
    assert admit(kv, s) == 4
    compute(kv, s, 1)
    kv.free(s)  # what the scheduler's preemption does
    s.preempt()
    assert admit(kv, s) == 5
    assert [c for *_, c in kv.stats.recent] == [0, 4] and s.num_cached_tokens == 4
    kv.check_invariants()
