"""The bridge by hand, no model: two levels of reference counts step by step. A block's ref_count is the number
of live requests whose block table lists it plus one for the tree; lock_ref counts requests under a node.
`check_invariants()` after every operation compares both with who really holds what. The scenarios that any
block-level cache with the two counts must pass run on the mini-runtime textbook's cache too (`manager`). Each
task's tests run its own body and the stand-in's for the others (stand_in.py: `bridge_with`)."""
from __future__ import annotations

import pytest

from step01_kvcache.generate import SamplingParams
from step02_paged.geometry import PoolGeometry
from step02_paged.scheduler import admit as admit_after_match
from step04_radix import RadixSequence
from step05_bridge import BridgeKVCacheManager, OffsetKVCacheManager
from tests.step05.stand_in import bridge_with

BS = 4
MANAGERS = pytest.mark.parametrize("manager", [BridgeKVCacheManager, OffsetKVCacheManager], ids=["bridge", "offset"])


def seq(i: int, tokens: list[int]) -> RadixSequence:
    return RadixSequence(i, list(tokens), SamplingParams(max_new_tokens=4))


def admit(kv: BridgeKVCacheManager, s: RadixSequence) -> int:
    """What the scheduler does: match, then allocate the rest; returns the cached (block-aligned) tokens."""
    match = kv.get_computed_blocks(s)
    assert kv.allocate_slots(s, s.num_tokens - match.num_tokens, match)
    admit_after_match(kv, s, match)
    kv.check_invariants()
    return match.num_tokens


def compute(kv: BridgeKVCacheManager, s: RadixSequence, n: int | None = None) -> None:
    """What a forward does to the bookkeeping: n more tokens (default: the rest) have K/V."""
    s.advance(s.num_tokens - s.num_computed_tokens if n is None else n)
    kv.on_computed(s)
    kv.check_invariants()


def finish(kv: BridgeKVCacheManager, s: RadixSequence) -> None:
    kv.free(s)
    kv.check_invariants()


def refs(kv: BridgeKVCacheManager, blocks: list[int]) -> list[int]:
    return [kv.block_manager.ref_count[b] for b in blocks]


@pytest.mark.task("task5.insert")
def test_two_levels_of_reference_counts():
    kv = bridge_with("task5.insert")(PoolGeometry(16, BS))
    a = seq(0, range(10))  # 10 tokens: two full blocks and a partial one
    assert admit(kv, a) == 0
    compute(kv, a)
    full, partial = a.block_table[:2], a.block_table[2]
    assert refs(kv, full) == [2, 2], "each full block: held by a and by the tree"
    assert refs(kv, [partial]) == [1], "the partial block stays a's own: the tree shares only full blocks"
    assert kv.tree.num_tokens == 10 and kv.num_cached_blocks == kv.tree.total_size == 2

    b = seq(1, list(range(9)) + [50, 51, 52])  # shares 9 tokens with a: two full blocks
    assert admit(kv, b) == 8, "9 matched tokens, aligned down to 8"
    assert b.block_table[:2] == full and refs(kv, full) == [3, 3]
    assert kv.tree.depth(b.last_node) == 9, "b locks the node ending at its raw match (the tree split there)"

    finish(kv, a)
    assert refs(kv, full) == [2, 2] and kv.block_manager.ref_count[partial] == 0, "a's partial block is free"
    compute(kv, b)
    finish(kv, b)
    assert refs(kv, full) == [1, 1], "only the tree holds them now"
    assert kv.tree.protected_size == 0
    assert kv.block_manager.num_free + kv.num_cached_blocks == 16


@pytest.mark.task("task5.dedup")
def test_same_prompt_prefilled_twice_swaps_the_duplicate_for_the_trees_block():
    """The setting of the write-up's "release by re-match" mistake: requests admitted together all miss and
    compute the same prompt. The first insert gives its blocks to the tree; the others find them there, take
    references on the tree's blocks and drop their own copies (freed at once), so the block table and the ref
    counts agree."""
    kv = bridge_with("task5.dedup")(PoolGeometry(16, BS))
    reqs = [seq(i, range(12)) for i in range(3)]
    for r in reqs:
        assert admit(kv, r) == 0
    assert kv.block_manager.num_free == 16 - 9
    for r in reqs:
        compute(kv, r)
    shared = reqs[0].block_table
    assert all(r.block_table == shared for r in reqs)
    assert refs(kv, shared) == [4, 4, 4], "three requests and the tree"
    assert kv.block_manager.num_free == 16 - 3, "the six duplicate blocks were freed"
    for r in reqs:
        finish(kv, r)
    assert refs(kv, shared) == [1, 1, 1]


class ReleaseByRematch(BridgeKVCacheManager):
    """The Pico-vLLM write-up's first design, written wrong on purpose: a request keeps its own blocks even
    where the tree has the same tokens, and on close releases what a *new match of its tokens* returns -
    blocks that may belong to someone else - instead of the blocks it holds."""

    def cache_unfinished_req(self, seq):  # insert and move the lock, but keep the duplicates
        n = self._insert(seq)
        _, node = self.tree.match_prefix(seq.all_token_ids[:n])
        self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(seq.last_node)
        seq.last_node, seq.cache_protected_len = node, n

    def cache_finished_req(self, seq):
        self._insert(seq)
        blocks, _ = self.tree.match_prefix(seq.all_token_ids[: seq.num_computed_tokens])
        self.block_manager.release(blocks)
        self.tree.dec_lock_ref(seq.last_node)
        seq.block_table, seq.last_node, seq.cache_protected_len = [], None, 0

    def check_invariants(self):
        pass  # it would fail at once: that is the point of the test below


def test_releasing_by_rematch_frees_blocks_it_never_held():
    kv = ReleaseByRematch(PoolGeometry(16, BS))
    req4, req5, req6 = (seq(i, range(12)) for i in (4, 5, 6))
    for r in (req4, req5, req6):  # all submitted before any step: all miss
        kv.allocate_slots(r, 12, kv.get_computed_blocks(r))
    abc = req4.block_table
    for r in (req4, req5, req6):
        r.advance(12)
        kv.on_computed(r)  # req4 inserts [A, B, C]; req5's and req6's inserts find them: "newly_held = []"
    assert req5.block_table != abc and refs(kv, abc) == [2, 2, 2], "held by req4 and the tree only"
    kv.free(req5)  # releases the tree's match, [A, B, C], which req5 never held
    assert refs(kv, abc) == [1, 1, 1], "req5 took references that were req4's and the tree's"
    kv.free(req6)
    assert refs(kv, abc) == [0, 0, 0] and kv.block_manager.num_free > 0, "A, B, C are free while req4 runs"
    with pytest.raises(ValueError, match="below zero"):
        kv.free(req4)  # the write-up saw ref -1 and a crash on the next adopt; our BlockManager refuses
    ok = BridgeKVCacheManager(PoolGeometry(16, BS))  # the same run with the chapter's bridge
    reqs = [seq(i, range(12)) for i in (4, 5, 6)]
    for step in (admit, compute, finish):
        for r in reqs:
            step(ok, r)  # check_invariants() after each
    assert ok.block_manager.num_free + ok.num_cached_blocks == 16


def test_node_pointer_lock_survives_a_split_above_it():
    """The "locking by token path" setting at block level: R locks the node where its 125-token match ends; another
    request's insert then splits R's path at 100; unlocking R by its node pointer walks the new node too."""
    kv = BridgeKVCacheManager(PoolGeometry(64, 16))
    x = seq(0, range(144))
    admit(kv, x)
    compute(kv, x)
    finish(kv, x)
    r = seq(1, list(range(125)) + [500] * 19)
    assert admit(kv, r) == 112
    y = seq(2, list(range(100)) + [600] * 10)
    assert admit(kv, y) == 96  # y's match splits the 125-token node at 100, above r's node
    assert kv.tree.depth(r.last_node.parent) == 100 and r.last_node.parent.lock_ref == 2
    compute(kv, y)
    finish(kv, r)
    finish(kv, y)
    assert all(n.lock_ref == 0 for n in kv.tree.nodes())


@pytest.mark.task("task5.insert")
def test_eviction_frees_only_what_no_request_uses():
    kv = bridge_with("task5.insert")(PoolGeometry(8, BS))
    a = seq(0, range(16))
    admit(kv, a)
    compute(kv, a)
    finish(kv, a)  # 4 cached blocks, unlocked
    b = seq(1, list(range(8)) + [90] * 4)
    assert admit(kv, b) == 8  # locks the first 8 tokens
    assert kv.block_manager.num_free == 3
    c = seq(2, [70] * 16)
    assert admit(kv, c) == 0, "needs 4 blocks, 3 free: eviction takes a's unlocked tail [8, 16)"
    assert kv.num_evicted == 2 and kv.tree.depth(b.last_node) == 8
    assert refs(kv, b.block_table[:2]) == [2, 2], "b's locked prefix survived"
    for s in (b, c):
        compute(kv, s)
        finish(kv, s)
    assert kv.block_manager.num_free + kv.num_cached_blocks == 8


@MANAGERS
def test_preempted_request_finds_its_own_blocks_again(manager):
    kv = manager(PoolGeometry(16, BS))
    a = seq(0, range(10))
    admit(kv, a)
    compute(kv, a, 6)  # a first chunk of 6 tokens: one full block goes to the tree
    assert kv.num_cached_blocks == 1
    kv.free(a)  # preemption: what was computed stays cached
    a.preempt()
    kv.check_invariants()
    assert admit(kv, a) == 4
    compute(kv, a)
    finish(kv, a)


@MANAGERS
def test_reset_cache_needs_a_drained_manager_and_frees_everything(manager):
    kv = manager(PoolGeometry(16, BS))
    a = seq(0, range(10))
    admit(kv, a)
    with pytest.raises(RuntimeError, match="use it"):
        kv.reset_cache()
    compute(kv, a)
    finish(kv, a)
    kv.reset_cache()
    kv.check_invariants()
    assert kv.block_manager.num_free == 16 and kv.tree.total_size == 0


@MANAGERS
def test_check_invariants_names_a_broken_count(manager):
    kv = manager(PoolGeometry(16, BS))
    a = seq(0, range(10))
    admit(kv, a)
    compute(kv, a)
    kv.block_manager.ref_count[a.block_table[0]] += 1  # someone counted without holding
    with pytest.raises(AssertionError, match="ref_count 3 but 2 holders"):
        kv.check_invariants()


@MANAGERS
def test_a_stale_match_is_refused_and_changes_nothing(manager):
    """Look up A; another admission evicts A's matched node; allocating A with the old match is refused."""
    kv = manager(PoolGeometry(4, BS))
    old = seq(0, range(9))
    admit(kv, old)
    compute(kv, old)
    finish(kv, old)  # two full blocks cached, unlocked
    a = seq(1, list(range(8)) + [7])
    match = kv.get_computed_blocks(a)
    assert match.num_tokens == 8
    assert admit(kv, seq(2, [50] * 16)) == 0, "needs all 4 blocks: the tree is evicted, a's node with it"
    assert not kv.tree.contains(match.node)
    before = (list(kv.block_manager.ref_count), dict(kv.holders))
    with pytest.raises(ValueError, match="stale match"):
        kv.allocate_slots(a, 1, match)
    assert (list(kv.block_manager.ref_count), dict(kv.holders)) == before and a.block_table == []
    kv.check_invariants()


@MANAGERS
def test_a_preempted_request_is_counted_once(manager):
    """Re-admitted after a preemption, a request finds its own blocks: no prompt hit, no second admission."""
    kv = manager(PoolGeometry(16, BS))
    first = seq(0, range(5))
    admit(kv, first)
    compute(kv, first)
    finish(kv, first)  # one full block cached
    s = seq(1, range(10))
    assert admit(kv, s) == 4
    compute(kv, s, 4)  # a first chunk: two full blocks now in the tree
    kv.free(s)  # what the scheduler's preemption does
    s.preempt()
    assert admit(kv, s) == 8
    assert [c for *_, c in kv.stats.recent] == [0, 4] and s.num_cached_tokens == 4


class FailingEviction(BridgeKVCacheManager):
    """A bridge whose eviction raises (a host copy that failed, say), to see what admission leaves behind."""

    def _evict_leaf(self, leaf):
        raise RuntimeError("eviction failed")


def test_an_admission_whose_eviction_raises_leaves_no_lock_behind():
    kv = FailingEviction(PoolGeometry(6, BS))
    for i, tokens in enumerate((range(8), range(50, 58))):  # two finished requests: four blocks cached, unlocked
        done = seq(i, tokens)
        admit(kv, done)
        compute(kv, done)
        finish(kv, done)
    b = seq(2, list(range(8)) + [9] * 8)  # shares the first two blocks, needs three more: an eviction, which raises
    match = kv.get_computed_blocks(b)
    assert match.num_tokens == 8
    locks = [n.lock_ref for n in kv.tree.nodes()]
    with pytest.raises(RuntimeError, match="eviction failed"):
        kv.allocate_slots(b, b.num_tokens - match.num_tokens + BS, match)
    assert [n.lock_ref for n in kv.tree.nodes()] == locks and not kv.holders, "the lock went with the failure"
    kv.check_invariants()
    assert kv.reset_cache() == 4  # nothing is locked: the cache can be dropped


@pytest.mark.parametrize("bad", [-4, 2.5, True, None])
def test_bad_host_tier_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="host_blocks"):
        BridgeKVCacheManager(PoolGeometry(4, BS), host_blocks=bad)
