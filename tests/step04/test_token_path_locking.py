"""The Pico-vLLM write-up's "locking by token path" mistake, as a regression test: lock by re-walking a token
path, and an insert that splits an edge between the lock and the unlock makes the unlock walk a node the lock
never counted - lock_ref goes to -1. Locking by node pointer along the parent chain stays symmetric whatever
splits happen in between."""
from __future__ import annotations

import pytest

from step04_radix.radix_tree import RadixTree, TreeNode
from tests.step04.stand_in import tree_with

X = list(range(1000, 1144))  # a cached request: one 144-token edge
R = X[:125] + list(range(2000, 2019))  # a new request: shares 125 tokens with X, then 19 of its own


class TokenPathLocking:
    """The write-up's first design, written wrong on purpose: a request remembers a token path, not a node.

    `lock(tokens)` / `unlock(tokens)` walk from the root and count every edge lying entirely inside the path;
    nothing is split, so a path that ends inside an edge leaves that edge uncounted. The request locks the
    prefix it matched and, when it closes, unlocks the prefix it now holds in the tree.
    """

    def __init__(self, tree: RadixTree) -> None:
        self.tree = tree

    def matched_len(self, tokens: list[int]) -> int:
        """Tokens of `tokens` found in the tree, without splitting anything."""
        node, pos = self.tree.root, 0
        while pos < len(tokens) and (child := node.children.get(tokens[pos])) is not None:
            n = 0
            while n < len(child.key) and pos + n < len(tokens) and child.key[n] == tokens[pos + n]:
                n += 1
            pos += n
            if n < len(child.key):
                break
            node = child
        return pos

    def _walk(self, tokens: list[int]) -> list[TreeNode]:
        node, pos, out = self.tree.root, 0, []
        while pos < len(tokens) and (child := node.children.get(tokens[pos])) is not None:
            if tokens[pos: pos + len(child.key)] != child.key:
                break  # the path ends inside this edge: it is not counted
            out.append(child)
            node, pos = child, pos + len(child.key)
        return out

    def lock(self, tokens: list[int]) -> None:
        for node in self._walk(tokens):
            node.lock_ref += 1

    def unlock(self, tokens: list[int]) -> None:
        for node in self._walk(tokens):
            node.lock_ref -= 1


def tree_with_x(tree_class: type[RadixTree] = RadixTree) -> RadixTree:
    tree = tree_class()
    tree.insert(X, list(range(len(X))))
    return tree


def test_token_path_locking_underflows_after_an_insert_splits_the_edge():
    tree = tree_with_x()
    locks = TokenPathLocking(tree)
    matched = locks.matched_len(R)
    assert matched == 125
    locks.lock(R[:matched])  # the 144-token edge does not fit in 125 tokens: nothing is counted
    assert [n.lock_ref for n in tree.nodes()] == [0]

    held = tree.insert(R, list(range(500, 500 + len(R))))  # R finishes: its insert splits X's edge at 125
    assert held == 125 and [n.key[:1] for n in tree.nodes()] == [[1000], [1125], [2000]]
    locks.unlock(R)  # the path R holds now crosses the 125-token node the lock never saw

    split_node = tree.root.children[1000]
    assert len(split_node.key) == 125 and split_node.lock_ref == -1, "locking by token path: lock_ref underflow"
    with pytest.raises(AssertionError, match="negative lock_ref"):
        tree.check_invariants()


@pytest.mark.task("task4.lock")
def test_node_pointer_locking_holds():
    tree = tree_with_x(tree_with("task4.lock"))  # the student's locks; match and insert the stand-in's
    slots, last_node = tree.match_prefix(R[:-1])  # the match splits X's edge exactly where R leaves it
    assert len(slots) == 125 and tree.depth(last_node) == 125
    tree.inc_lock_ref(last_node)  # the request keeps this pointer, never a token path
    assert tree.protected_size == 125 and tree.evictable_size == 19

    tree.insert(R, slots + list(range(500, 519)))  # R finishes
    tree.insert(X[:60] + [7], list(range(600, 661)))  # someone else splits the locked edge at 60
    chain = tree.path(last_node)
    assert [len(n.key) for n in chain] == [60, 65] and [n.lock_ref for n in chain] == [1, 1], \
        "the new node on the chain copied the lock"
    tree.check_invariants()

    tree.dec_lock_ref(last_node)  # walks the parent chain as it is now, new node included
    assert all(n.lock_ref == 0 for n in tree.nodes())
    assert tree.protected_size == 0 and tree.evictable_size == tree.total_size == 144 + 19 + 1
    tree.check_invariants()
