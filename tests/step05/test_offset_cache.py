"""The mini-runtime textbook's prefix cache by hand, no model: its example step by step with the block ids it uses,
its table of reference counts (a hit retains, the tree retains what it adopts, a finish releases the request's own
blocks, eviction releases a leaf's), and the scenarios every block-level cache must pass: matches are whole blocks,
a partial block is never shared, a request releases what its block table holds. `check_invariants()` runs after
every operation (the helpers of test_bridge_cache.py, whose scenarios run on this manager too)."""
from __future__ import annotations

from collections import deque

from step02_paged.geometry import PoolGeometry
from step05_bridge import OffsetKVCacheManager
from tests.step05.test_bridge_cache import admit, compute, finish, refs, seq

BS = 16
FIRST = list(range(10, 58))  # 48 tokens: blocks 100, 101, 102 (the textbook labels them [10..47])
SECOND = FIRST[:20] + list(range(90, 102))  # shares 20 tokens; 32 in all


def textbook_manager() -> OffsetKVCacheManager:
    """A pool of 256 blocks whose free list hands out 100, 101, 102, 200 first: the textbook's block ids."""
    kv = OffsetKVCacheManager(PoolGeometry(256, BS))
    first = [100, 101, 102, 200]
    kv.block_manager.free_blocks = deque(first + [b for b in range(256) if b not in first])
    return kv


def test_the_textbook_example_step_by_step():
    kv = textbook_manager()
    r1 = seq(1, FIRST)
    assert admit(kv, r1) == 0 and r1.block_table == [100, 101, 102]
    compute(kv, r1)
    assert refs(kv, [100, 101, 102]) == [2, 2, 2], "the tree retains what it adopts; request 1 holds its own"
    finish(kv, r1)
    assert refs(kv, [100, 101, 102]) == [1, 1, 1], "a finish releases the request's own references only"

    r2 = seq(2, SECOND)
    match = kv.get_computed_blocks(r2)
    assert (match.blocks, match.num_tokens, match.offset) == ((100,), 16, 4), \
        "20 common tokens: the match returns block 100 (16 tokens) and the offset 4 of the block it cannot lend"
    assert admit(kv, r2) == 16 and r2.block_table == [100, 200], "request 2 prefills again from token 16"
    assert refs(kv, [100]) == [2], "a hit retains the matched block"
    compute(kv, r2)  # the insert: the split
    upper = r2.last_node.parent
    assert (upper.value, upper.offset, kv.tree.depth(upper)) == ([100], 0, 16), "the common node holds [100]"
    branches = {tuple(c.value): (c.offset, kv.tree.depth(c.parent)) for c in upper.children.values()}
    assert branches == {(101, 102): (4, 16), (200,): (4, 16)}, \
        "the original branch keeps [101, 102] with offset 4; the new branch [200] starts at token 16"
    assert refs(kv, [100, 101, 102, 200]) == [2, 1, 1, 2]
    finish(kv, r2)
    assert refs(kv, [100, 101, 102, 200]) == [1, 1, 1, 1], "only the tree holds them now"

    kv.evict(1)  # the least recently used unlocked leaf: the first prompt's branch
    assert refs(kv, [101, 102]) == [0, 0] and kv.num_evicted == 2, "eviction releases the leaf's blocks"
    assert upper.children and next(iter(upper.children.values())).offset == 0, "no sibling left: no offset"
    kv.check_invariants()


def test_evicting_a_leaf_a_request_still_reads_frees_nothing_it_holds():
    """The textbook's argument for the two counts: eviction drops the tree's reference, the request's stays. Here
    eviction takes unlocked leaves only, so the request's node is safe too; its blocks would be either way."""
    kv = textbook_manager()
    r1 = seq(1, FIRST)
    admit(kv, r1)
    compute(kv, r1)
    finish(kv, r1)
    r3 = seq(3, FIRST + [1])
    assert admit(kv, r3) == 48
    assert kv.evict(10) == 0, "every cached block is under r3's lock"
    assert refs(kv, [100, 101, 102]) == [2, 2, 2]
    compute(kv, r3)
    finish(kv, r3)
    assert kv.evict(10) == 3 and kv.block_manager.num_free == 256


def test_matches_are_whole_blocks_and_a_partial_block_is_never_shared():
    kv = OffsetKVCacheManager(PoolGeometry(16, 4))
    a = seq(0, range(10))  # two full blocks and a partial one
    admit(kv, a)
    compute(kv, a)
    assert kv.num_cached_blocks == 2 and kv.tree.depth(a.last_node) == 8, "the tree takes the full blocks only"
    partial = a.block_table[2]
    assert refs(kv, [partial]) == [1], "the partial block stays a's own"
    b = seq(1, list(range(10)) + [50])
    match = kv.get_computed_blocks(b)
    assert (match.num_tokens, match.offset) == (8, 0), "a's tokens 8 and 9 are in no block of the tree"
    assert admit(kv, b) == 8 and partial not in b.block_table
    for s in (a, b):
        compute(kv, s)
        finish(kv, s)
    assert kv.block_manager.num_free + kv.num_cached_blocks == 16


def test_the_same_prompt_three_times_releases_by_block_table():
    """The setting of the "release by re-match" mistake: three misses on the same prompt. The first insert gives
    its blocks to the tree; the others swap their copies for the tree's, and each release follows its block table."""
    kv = OffsetKVCacheManager(PoolGeometry(16, 4))
    reqs = [seq(i, range(12)) for i in range(3)]
    for r in reqs:
        assert admit(kv, r) == 0
    for r in reqs:
        compute(kv, r)
    shared = reqs[0].block_table
    assert all(r.block_table == shared for r in reqs) and refs(kv, shared) == [4, 4, 4]
    assert kv.block_manager.num_free == 16 - 3
    for r in reqs:
        finish(kv, r)
    assert refs(kv, shared) == [1, 1, 1]


def test_a_lock_survives_a_split_above_it():
    """A request locks the node where its match ends (125 common tokens, 112 in whole blocks); another prompt then
    parts from that path inside the seventh block: the split falls at 96, above the locked node, and the unlock
    walks the new node too."""
    kv = OffsetKVCacheManager(PoolGeometry(64, BS))
    x = seq(0, range(144))
    admit(kv, x)
    compute(kv, x)
    finish(kv, x)
    r = seq(1, list(range(125)) + [500] * 19)
    assert admit(kv, r) == 112
    y = seq(2, list(range(100)) + [600] * 30)
    assert kv.get_computed_blocks(y).offset == 4 and admit(kv, y) == 96
    compute(kv, y)  # y's block [96, 112) parts from x's after 4 tokens: both branches get offset 4
    assert kv.tree.depth(r.last_node.parent) == 96 and r.last_node.parent.lock_ref == 2
    assert sorted(c.offset for c in r.last_node.parent.children.values()) == [4, 4]
    finish(kv, r)
    finish(kv, y)
    assert all(n.lock_ref == 0 for n in kv.tree.nodes())
