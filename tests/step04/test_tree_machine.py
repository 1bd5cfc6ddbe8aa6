"""Hypothesis state machine over the radix tree alone: random insert / match / lock / unlock / evict against a
model of what is cached (token prefix -> slot), with the tree's invariants and slot ownership checked after
every operation. Tokens come from a 3-letter alphabet so that prefixes collide and edges split all the time."""
from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from step04_radix.radix_tree import RadixTree, TreeNode

POOL = 48
tokens_st = st.lists(st.integers(0, 2), min_size=1, max_size=12)


class TreeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tree = RadixTree()
        self.free = list(range(POOL))
        self.model: dict[tuple[int, ...], int] = {}  # every cached prefix -> slot of its last token
        self.locks: list[tuple[TreeNode, tuple[int, ...]]] = []  # (node pointer, its prefix) per held lock

    def cached_len(self, tokens: list[int]) -> int:
        k = 0
        while k < len(tokens) and tuple(tokens[: k + 1]) in self.model:
            k += 1
        return k

    @rule(tokens=tokens_st)
    def insert(self, tokens):
        known = self.cached_len(tokens)
        if len(tokens) - known > len(self.free):
            return
        slots = [self.model[tuple(tokens[: i + 1])] for i in range(known)]  # what a request got from match
        slots += [self.free.pop() for _ in range(len(tokens) - known)]  # ... plus what it computed
        present = self.tree.insert(tokens, slots)
        assert present == known, "insert must report exactly the cached prefix"
        for i in range(known, len(tokens)):
            self.model[tuple(tokens[: i + 1])] = slots[i]

    @rule(tokens=tokens_st)
    def match(self, tokens):
        slots, node = self.tree.match_prefix(tokens)
        k = self.cached_len(tokens)
        assert slots == [self.model[tuple(tokens[: i + 1])] for i in range(k)]
        assert self.tree.prefix_tokens(node) == tokens[:k], "last_node must end exactly at the match"

    @rule(tokens=tokens_st)
    def lock(self, tokens):
        slots, node = self.tree.match_prefix(tokens)
        if node is not self.tree.root:
            self.tree.inc_lock_ref(node)
            self.locks.append((node, tuple(tokens[: len(slots)])))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        node, _ = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.tree.dec_lock_ref(node)

    @rule(n=st.integers(0, 20))
    def evict(self, n):
        evictable = self.tree.evictable_size
        freed: list[int] = []
        got = self.tree.evict(n, lambda leaf: freed.extend(leaf.value))
        assert got == len(freed) and got >= min(n, evictable)
        assert got <= evictable, "evicted locked tokens"
        self.free += freed
        gone = set(freed)
        self.model = {p: s for p, s in self.model.items() if s not in gone}
        for _, prefix in self.locks:
            assert self.cached_len(list(prefix)) == len(prefix), "a locked prefix was evicted"

    @invariant()
    def consistent(self):
        tree = self.tree
        tree.check_invariants()
        assert sorted(tree.all_slots() + self.free) == list(range(POOL)), "a slot leaked or has two owners"
        assert tree.total_size == len(self.model)
        held = Counter(n.id for node, _ in self.locks for n in tree.path(node))
        assert all(n.lock_ref == held[n.id] for n in tree.nodes()), "lock_ref != locks held through the node"
        for node, prefix in self.locks:
            assert tuple(tree.prefix_tokens(node)) == prefix, "a held node no longer ends its prefix"

    def teardown(self):
        for node, _ in self.locks:
            self.tree.dec_lock_ref(node)
        assert self.tree.protected_size == 0
        self.tree.evict(POOL, lambda leaf: self.free.extend(leaf.value))
        assert self.tree.total_size == 0 and sorted(self.free) == list(range(POOL))
        self.tree.check_invariants()


TestTreeMachine = TreeMachine.TestCase
TestTreeMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
