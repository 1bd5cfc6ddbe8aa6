"""The block tree alone: the Pico-vLLM write-up's block-attribution rule on splits, matches that come out
block-aligned by construction (never a partial block: the write-up's "unaligned match" mistake), and a
Hypothesis machine of random insert / match / lock / unlock / evict against a model of which block holds
which full-block prefix."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from step05_bridge import BlockRadixTree

BS = 16
X = list(range(1000, 1096))  # 96 tokens: six full blocks


@pytest.mark.task("task5.span")
def test_write_up_split_example():
    """A 96-token edge [B0..B5] split after 90 tokens: the head keeps B0..B4 (80 tokens' worth), the tail the
    block whose last token it holds, B5, although only its last 6 tokens are on the tail's edge."""
    tree = BlockRadixTree(BS)
    tree.insert(X, [10, 11, 12, 13, 14, 15])
    assert tree.insert(X[:90] + [7] * 22, [10, 11, 12, 13, 14, 20, 21]) == 90
    head = tree.root.children[1000]
    assert (len(head.key), head.value) == (90, [10, 11, 12, 13, 14])
    assert {len(c.key): c.value for c in head.children.values()} == {6: [15], 22: [20, 21]}, \
        "num_split_blocks = (i + match_len) // bs - i // bs, with i = 0 and match_len = 90"
    tree.check_invariants()


@pytest.mark.task("task5.span")
def test_a_split_deep_in_the_tree_counts_from_the_edge_start():
    """An edge starting at position 40 (not a block boundary) split after 30 tokens: blocks ending at 47 and 63
    go to the head [40, 70), the one ending at 79 stays with the tail [70, 90)."""
    tree = BlockRadixTree(BS)
    tree.insert(X[:40], [1, 2])
    tree.insert(X[:90], [1, 2, 3, 4, 5])  # a child edge [40, 90) owning blocks 3 (ends 47), 4 (63), 5 (79)
    tree.insert(X[:70] + [9] * 30, [1, 2, 3, 4, 6, 7])
    edge = tree.root.children[1000].children[1040]
    assert (len(edge.key), edge.value) == (30, [3, 4])
    assert sorted((len(c.key), c.value) for c in edge.children.values()) == [(20, [5]), (30, [6, 7])]
    tree.check_invariants()


@pytest.mark.task("task5.span")
def test_a_match_ending_off_a_block_boundary_is_block_aligned():
    """The write-up's unaligned-match mistake, avoided: after a split at 125 the node's depth is not a multiple
    of 16. The match stops there, but the blocks on its path cover 112 tokens: 125 // 16 = 7 blocks, never a
    partial one."""
    tree = BlockRadixTree(BS)
    a = list(range(144))
    tree.insert(a, list(range(100, 109)))
    blocks, node = tree.match_prefix(a[:125] + [999])
    assert tree.depth(node) == 125 and blocks == list(range(100, 107)) and len(blocks) * BS == 112
    tree.check_invariants()


def test_insert_wants_one_block_per_full_block_of_tokens():
    tree = BlockRadixTree(4)
    with pytest.raises(ValueError, match="10 tokens need 2 values, got 3"):
        tree.insert(list(range(10)), [1, 2, 3])
    assert tree.total_size == 0


POOL = 24
tokens_st = st.lists(st.integers(0, 2), min_size=1, max_size=14)




class BlockTreeMachine(RuleBasedStateMachine):
    """Tokens from a 3-letter alphabet with block_size 3, so edges split at every offset inside a block."""

    bs = 3

    def __init__(self) -> None:
        super().__init__()
        self.tree = BlockRadixTree(self.bs)
        self.free = list(range(POOL))
        self.block_of: dict[tuple[int, ...], int] = {}  # a cached full-block prefix -> the block holding its end
        self.locks: list[tuple[object, tuple[int, ...]]] = []

    def cached_len(self, tokens: list[int]) -> int:
        """How many leading tokens are cached: the tree routes them (a partial last block included)."""
        _, node = self.tree.match_prefix(tokens)  # splitting on a match changes no answer of the tree
        return self.tree.depth(node)

    @rule(tokens=tokens_st)
    def insert(self, tokens):
        known = self.cached_len(tokens)
        full = len(tokens) // self.bs
        if full - known // self.bs > len(self.free):
            return
        blocks = [self.block_of[tuple(tokens[: (i + 1) * self.bs])] for i in range(known // self.bs)]
        blocks += [self.free.pop() for _ in range(full - known // self.bs)]
        assert self.tree.insert(tokens, blocks) == known
        for i in range(known // self.bs, full):
            self.block_of[tuple(tokens[: (i + 1) * self.bs])] = blocks[i]

    @rule(tokens=tokens_st)
    def match(self, tokens):
        blocks, node = self.tree.match_prefix(tokens)
        k = self.tree.depth(node)
        assert self.tree.prefix_tokens(node) == tokens[:k]
        assert blocks == [self.block_of[tuple(tokens[: (i + 1) * self.bs])] for i in range(k // self.bs)], \
            "a match returns exactly the full blocks of the matched prefix"

    @rule(tokens=tokens_st)
    def lock(self, tokens):
        _, node = self.tree.match_prefix(tokens)
        if node is not self.tree.root:
            self.tree.inc_lock_ref(node)
            self.locks.append((node, tuple(self.tree.prefix_tokens(node))))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        node, _ = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.tree.dec_lock_ref(node)

    @rule(n=st.integers(0, 8))
    def evict(self, n):
        freed: list[int] = []
        got = self.tree.evict(n, lambda leaf: freed.extend(leaf.value))
        assert got == len(freed)
        self.free += freed
        gone = set(freed)
        self.block_of = {p: b for p, b in self.block_of.items() if b not in gone}
        for node, prefix in self.locks:
            assert self.tree.contains(node) and tuple(self.tree.prefix_tokens(node)) == prefix, \
                "a locked prefix was evicted"

    @invariant()
    def consistent(self):
        tree = self.tree
        tree.check_invariants()
        assert sorted(tree.all_blocks() + self.free) == list(range(POOL)), "a block leaked or has two owners"
        assert sorted(tree.all_blocks()) == sorted(self.block_of.values()), "tree and model hold different blocks"
        held = Counter(n.id for node, _ in self.locks for n in tree.path(node))
        assert all(n.lock_ref == held[n.id] for n in tree.nodes()), "lock_ref != locks held through the node"

    def teardown(self):
        for node, _ in self.locks:
            self.tree.dec_lock_ref(node)
        self.tree.evict(10**9, lambda leaf: self.free.extend(leaf.value))  # everything: leaves that own no block go too
        assert self.tree.total_size == 0 and sorted(self.free) == list(range(POOL))


class TokenGranularBlockTreeMachine(BlockTreeMachine):
    """block_size 1: the block tree must behave exactly as chapter 4's slot tree."""

    bs = 1


TestBlockTreeMachine = BlockTreeMachine.TestCase
TestBlockTreeMachine.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestTokenGranularBlockTreeMachine = TokenGranularBlockTreeMachine.TestCase
TestTokenGranularBlockTreeMachine.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
