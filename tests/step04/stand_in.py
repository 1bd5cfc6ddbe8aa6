"""A stand-in for the radix tree's homework bodies, written for chapter 4's tests, so that each task is graded on its
own: `tree_with("task4.match")` is a RadixTree whose `match_prefix` is the student's and whose other task bodies
(insert with its split, the locks, eviction) are the plain versions below. A task's tests build their trees and
find their nodes through the stand-in, and reach no other task's stub.

The plain versions say what a correct body does, as slowly as is clear: token by token, the candidates sorted
again at each eviction. They keep the tree's own bookkeeping through its helpers (`_add_leaf`, `_refresh_leaf`,
`_delete_leaf`, `span`), as the student's bodies do.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from step04_radix.radix_tree import RadixTree, TreeNode


class StandInTree(RadixTree):
    """Every homework body of RadixTree, written plainly."""

    def _walk(self, tokens: list[int], grow: Sequence[int] | None) -> tuple[list[int], TreeNode, int]:
        """Follow `tokens` from the root, marking the path used and splitting an edge where they leave it; with
        `grow` (the values of `tokens`) the rest hangs under the last node. Returns the slots matched, the node
        where the match ends and how many tokens matched."""
        self._clock += 1
        node, pos, slots = self.root, 0, []
        node.last_access = self._clock
        while pos < len(tokens) and tokens[pos] in node.children:
            child = node.children[tokens[pos]]
            child.last_access = self._clock
            n = 0
            while n < len(child.key) and pos + n < len(tokens) and child.key[n] == tokens[pos + n]:
                n += 1
            child = child if n == len(child.key) else self._split_node(child, pos, n)
            slots += child.value
            node, pos = child, pos + n  # after a split the walk stops: the next token leaves the edge
        if grow is not None and pos < len(tokens):
            self._add_leaf(node, tokens[pos:], list(grow)[self.span(0, pos):])
        return slots, node, pos

    def match_prefix(self, tokens: Sequence[int]) -> tuple[list[int], TreeNode]:
        slots, node, _ = self._walk(list(tokens), None)
        return slots, node

    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> int:
        if len(slots) != self.span(0, len(tokens)):
            raise ValueError(f"{len(tokens)} tokens need {self.span(0, len(tokens))} values, got {len(slots)}")
        return self._walk(list(tokens), slots)[2]

    def _split_node(self, child: TreeNode, start: int, split_len: int) -> TreeNode:
        head_values = len(child.value) - self.span(start + split_len, start + len(child.key))
        upper = self._new_node(child.key[:split_len], child.value[:head_values], child.parent)
        upper.lock_ref, upper.last_access = child.lock_ref, child.last_access
        child.parent.children[child.key[0]] = upper
        child.key, child.value, child.parent = child.key[split_len:], child.value[head_values:], upper
        upper.children[child.key[0]] = child
        return upper

    def _lock(self, node: TreeNode, step: int) -> None:
        for n in self.path(node):
            before = n.lock_ref
            n.lock_ref += step
            if (before == 0) != (n.lock_ref == 0):  # the node's values change side
                moved = len(n.value) if before == 0 else -len(n.value)
                self._evictable_size -= moved
                self._protected_size += moved
            self._refresh_leaf(n)

    def inc_lock_ref(self, node: TreeNode) -> None:
        self._check_attached(node)
        self._lock(node, 1)

    def dec_lock_ref(self, node: TreeNode) -> None:
        self._check_attached(node)
        if any(n.lock_ref <= 0 for n in self.path(node)):
            raise ValueError(f"lock_ref underflow at {node!r}: unlocked more often than locked")
        self._lock(node, -1)

    def evict(self, num: int, on_evict: Callable[[TreeNode], object]) -> int:
        freed = 0
        while freed < num and self._evictable_leaves:
            leaf = min(self._evictable_leaves, key=lambda n: (n.last_access, n.id))
            size = len(leaf.value)
            on_evict(leaf)
            self._delete_leaf(leaf)
            freed += size
        return freed


BODIES = {"task4.match": ("match_prefix",), "task4.insert": ("insert", "_split_node"),
          "task4.lock": ("inc_lock_ref", "dec_lock_ref"), "task4.evict": ("evict",)}


def tree_with(*tasks: str, base: type[RadixTree] = StandInTree) -> type[RadixTree]:
    """A tree class whose bodies of `tasks` are RadixTree's (the student's), the others the stand-in's."""
    own = {name: getattr(RadixTree, name) for task in tasks for name in BODIES[task]}
    return type(f"TreeWith_{'_'.join(t.split('.')[1] for t in tasks)}", (base,), own)
