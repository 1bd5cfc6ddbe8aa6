"""RadixTree: SGLang's token-level prefix tree over KV slots (one token per slot).

Every node holds an edge: a run of tokens (`key`) and the KV slots that hold their K/V (`value`, one slot per
token). Children are keyed by the first token of their edge, so a walk from the root follows a prompt token by
token and stops exactly where the prompt leaves what is cached - at any position, not only at a block edge.

Two numbers per node drive memory management:
- `lock_ref`: how many live requests use this node's tokens. A request locks the node where its cached
  prefix ends and the lock is added along the whole parent chain; a node with `lock_ref > 0` is *protected*.
- `last_access`: a logical clock, bumped along the path of every match and insert. Unlocked leaves are
  *evictable*; `evict` drops the least recently used ones first and a parent that becomes an unlocked
  leaf joins the candidates.
The tree keeps two sums up to date as locks change, in values (as SGLang counts them): `evictable_size` (what
eviction could reclaim) and `protected_size` (what live requests use), so asking costs O(1).

The tree never allocates or frees slots itself: `insert` reports how many of the caller's tokens were already
cached (the caller frees its duplicate slots) and `evict` hands freed slots to a callback.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence


class TreeNode:
    """One edge of the tree. The root has an empty edge and is never evicted."""

    __slots__ = ("id", "key", "value", "children", "parent", "lock_ref", "last_access")

    def __init__(self, node_id: int, key: list[int], value: list[int], parent: TreeNode | None,
                 last_access: int = 0) -> None:
        self.id = node_id  # creation order: stable names in drawings and a tie-break in the LRU heap
        self.key = key  # the edge's tokens
        self.value = value  # their KV slots, value[i] holds the K/V of key[i]
        self.children: dict[int, TreeNode] = {}  # first token of the child's edge -> child
        self.parent = parent
        self.lock_ref = 0
        self.last_access = last_access

    def __repr__(self) -> str:
        head = ", ".join(map(str, self.key[:4])) + (", ..." if len(self.key) > 4 else "")
        return f"TreeNode(#{self.id}, [{head}] x{len(self.key)}, lock_ref={self.lock_ref}, t={self.last_access})"


def common_prefix_len(edge: list[int], tokens: list[int], start: int = 0) -> int:
    """How many leading tokens of `edge` equal tokens[start:]. Slice comparisons run in C, so a 2k-token edge
    costs microseconds: first the whole edge at once (the common case), else a binary search for the split."""
    n = min(len(edge), len(tokens) - start)
    head = edge if n == len(edge) else edge[:n]
    if head == (tokens if start == 0 and n == len(tokens) else tokens[start:start + n]):
        return n
    lo, hi = 0, n  # edge[:lo] matches, edge[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if edge[lo:mid] == tokens[start + lo:start + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _as_list(xs: Sequence[int]) -> list[int]:
    return xs if isinstance(xs, list) else list(xs)


class RadixTree:
    """Token-level radix tree with lock counts, size accounting and LRU leaf eviction."""

    def __init__(self) -> None:
        self.reset()

    def span(self, start: int, end: int) -> int:
        """How many `value` entries an edge covering path positions [start, end) holds: one slot per token. It is
        the one place that ties values to tokens; insert, split and the invariants ask it."""
        return end - start

    def reset(self) -> None:
        """Forget everything (the caller frees the slots first). The root is locked forever."""
        self._next_id = 0
        self._clock = 0
        self.root = self._new_node([], [], None)
        self.root.lock_ref = 1
        self._evictable_size = 0  # values in nodes with lock_ref == 0
        self._protected_size = 0  # values in nodes with lock_ref > 0
        self._evictable_leaves: set[TreeNode] = set()  # unlocked leaves: the eviction candidates

    # ---- sizes -------------------------------------------------------------------------------------------
    @property
    def evictable_size(self) -> int:
        """Values (KV slots here, one per token; blocks in chapter 5) that no request uses: reclaimable."""
        return self._evictable_size

    @property
    def protected_size(self) -> int:
        """Values that some live request uses (locked)."""
        return self._protected_size

    @property
    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    def _new_node(self, key: list[int], value: list[int], parent: TreeNode | None) -> TreeNode:
        node = TreeNode(self._next_id, key, value, parent, self._clock)
        self._next_id += 1
        return node

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # ---- match -------------------------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int]) -> tuple[list[int], TreeNode]:
        """The slots of the longest cached prefix of `tokens`, and the node where that prefix ends.

        Every node on the path is marked as used now. When the match ends inside an edge, that edge is split
        so that the returned node ends exactly at the match: a request can then lock precisely its prefix.
        """
        tokens = _as_list(tokens)
        # BEGIN SOLUTION task4.match points=2
        now = self._tick()
        node = self.root
        node.last_access = now
        slots: list[int] = []
        pos = 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            child.last_access = now
            n = common_prefix_len(child.key, tokens, pos)
            if n < len(child.key):  # the match ends inside this edge: split there and stop
                node = self._split_node(child, pos, n)
                slots.extend(node.value)
                break
            slots.extend(child.value)
            node = child
            pos += n
        return slots, node
        # END SOLUTION

    # ---- insert ------------------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> int:
        """Cache `tokens` whose K/V sit in `slots`; returns how many leading tokens were cached already.

        Those first tokens keep the tree's own slots: the caller still owns slots[:returned] and must free
        the ones it does not share with the tree. The rest, slots[returned:], now belong to the tree.
        """
        tokens, slots = _as_list(tokens), _as_list(slots)
        if len(slots) != self.span(0, len(tokens)):
            raise ValueError(f"{len(tokens)} tokens need {self.span(0, len(tokens))} values, got {len(slots)}")
        # BEGIN SOLUTION task4.insert points=3
        now = self._tick()
        node = self.root
        node.last_access = now
        pos = 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                self._add_leaf(node, tokens[pos:], slots[self.span(0, pos):])
                break
            child.last_access = now
            n = common_prefix_len(child.key, tokens, pos)
            if n < len(child.key):
                child = self._split_node(child, pos, n)
            node = child
            pos += n
        return pos
        # END SOLUTION

    def _split_node(self, child: TreeNode, start: int, split_len: int) -> TreeNode:
        """Cut `child`'s edge, which starts at path position `start`, after `split_len` tokens: a new node takes the
        first part and becomes child's parent.

        The new node copies `lock_ref` (the same requests use both halves: a lock taken on `child` before the
        split still unwinds through the new node, since it lies on child's parent chain) and `last_access`.
        Sizes do not change; neither does the set of evictable leaves (the new node has a child).
        """
        # BEGIN SOLUTION task4.insert points=3
        parent = child.parent
        k = self.span(start, start + split_len)  # value entries that go with the first part
        new = self._new_node(child.key[:split_len], child.value[:k], parent)
        new.lock_ref = child.lock_ref
        new.last_access = child.last_access
        child.key, child.value = child.key[split_len:], child.value[k:]
        child.parent = new
        new.children[child.key[0]] = child
        parent.children[new.key[0]] = new
        return new
        # END SOLUTION

    def _add_leaf(self, parent: TreeNode, key: list[int], value: list[int]) -> TreeNode:
        """A new unlocked leaf under `parent` (accounting: its tokens are evictable)."""
        leaf = self._new_node(key, value, parent)
        parent.children[key[0]] = leaf
        self._evictable_size += len(value)
        self._refresh_leaf(parent)
        self._refresh_leaf(leaf)
        return leaf

    def _refresh_leaf(self, node: TreeNode) -> None:
        """Keep the candidate set exact: a node is in it iff it is a non-root leaf with lock_ref == 0."""
        if node is not self.root and node.lock_ref == 0 and not node.children:
            self._evictable_leaves.add(node)
        else:
            self._evictable_leaves.discard(node)

    # ---- locks -------------------------------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> None:
        """A request starts using the prefix that ends at `node`: lock it and every ancestor (not the root).
        Nodes going from 0 to 1 move their values from evictable to protected."""
        self._check_attached(node)
        # BEGIN SOLUTION task4.lock points=2
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable_size -= len(node.value)
                self._protected_size += len(node.value)
            node.lock_ref += 1
            self._refresh_leaf(node)
            node = node.parent
        # END SOLUTION

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref(node)`, along the parent chain as it is *now* (splits since then only add
        nodes to that chain, and they copied the lock). Raises ValueError, changing nothing, on underflow."""
        self._check_attached(node)
        for n in self.path(node):
            if n.lock_ref <= 0:
                raise ValueError(f"lock_ref underflow at {n!r}: unlocked more often than locked")
        # BEGIN SOLUTION task4.lock points=2
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected_size -= len(node.value)
                self._evictable_size += len(node.value)
            self._refresh_leaf(node)
            node = node.parent
        # END SOLUTION

    def _check_attached(self, node: TreeNode) -> None:
        if not self.contains(node):
            raise ValueError(f"{node!r} is not in this tree (evicted, or from another tree)")

    # ---- eviction ----------------------------------------------------------------------------------------
    def evict(self, num: int, on_evict: Callable[[TreeNode], object]) -> int:
        """Drop least recently used unlocked leaves until `num` values are freed (or none is left).

        Whole leaves go, so a little more than asked may be freed. `on_evict(leaf)` sees each leaf while it is still
        attached: its values are the caller's to free (or to copy elsewhere first, as chapter 5's host tier does).
        A parent whose last child went, and that nobody locks, is a leaf now and joins the candidates.
        Returns the number of values freed (what `TreeNode.value` lists).
        """
        # BEGIN SOLUTION task4.evict points=2
        heap = [(leaf.last_access, leaf.id, leaf) for leaf in self._evictable_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            on_evict(leaf)
            freed += len(leaf.value)
            self._delete_leaf(leaf)
            if parent is not self.root and parent.lock_ref == 0 and not parent.children:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed
        # END SOLUTION

    def _delete_leaf(self, leaf: TreeNode) -> None:
        """Detach an unlocked leaf (its slots were already handed back)."""
        if leaf.children or leaf.lock_ref or leaf is self.root:
            raise ValueError(f"only unlocked leaves can be deleted, not {leaf!r}")
        parent = leaf.parent
        del parent.children[leaf.key[0]]
        leaf.parent = None
        self._evictable_size -= len(leaf.value)
        self._evictable_leaves.discard(leaf)
        self._refresh_leaf(parent)

    # ---- reading the tree --------------------------------------------------------------------------------
    def nodes(self) -> Iterator[TreeNode]:
        """Every node but the root, parents before children, children in token order (deterministic)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root:
                yield node
            stack.extend(node.children[t] for t in sorted(node.children, reverse=True))

    @property
    def num_nodes(self) -> int:
        return sum(1 for _ in self.nodes())

    @property
    def num_tokens(self) -> int:
        """Tokens on all edges (with one slot per token, `total_size`; chapter 5's edges hold blocks)."""
        return sum(len(n.key) for n in self.nodes())

    def path(self, node: TreeNode) -> list[TreeNode]:
        """Nodes from the root's child down to `node` (empty for the root)."""
        out = []
        while node is not self.root:
            out.append(node)
            node = node.parent
        return out[::-1]

    def prefix_tokens(self, node: TreeNode) -> list[int]:
        return [t for n in self.path(node) for t in n.key]

    def prefix_slots(self, node: TreeNode) -> list[int]:
        return [s for n in self.path(node) for s in n.value]

    def depth(self, node: TreeNode) -> int:
        """Tokens from the root to the end of `node`'s edge."""
        return sum(len(n.key) for n in self.path(node))

    def contains(self, node: TreeNode) -> bool:
        """Whether `node` is still attached (an evicted node's parent pointer is cleared)."""
        while node is not self.root:
            parent = node.parent
            if parent is None or not node.key or parent.children.get(node.key[0]) is not node:
                return False
            node = parent
        return True

    def all_slots(self) -> list[int]:
        return [s for n in self.nodes() for s in n.value]

    def evictable_leaves(self) -> list[TreeNode]:
        """The eviction candidates, least recently used first."""
        return sorted(self._evictable_leaves, key=lambda n: (n.last_access, n.id))

    # ---- invariants --------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Structure, lock sums, size sums, the candidate set and slot uniqueness; AssertionError names the
        broken invariant."""
        root = self.root
        assert root.parent is None and not root.key and not root.value, "root must have an empty edge, no parent"
        assert root.lock_ref == 1, f"root lock_ref is {root.lock_ref}, must stay 1 (the root is never evicted)"
        evictable = protected = 0
        leaves, seen_slots, seen_ids = set(), set(), set()
        stack = [(root, 0)]  # (node, path position where its edge starts)
        while stack:
            node, start = stack.pop()
            assert node.id not in seen_ids, f"{node!r} reachable twice"
            seen_ids.add(node.id)
            child_locks = 0
            for first, child in node.children.items():
                assert child.parent is node, f"{child!r}: parent pointer does not point to the node above it"
                assert child.key and child.key[0] == first, f"{child!r} is filed under token {first}"
                assert child.last_access <= node.last_access, \
                    f"{child!r} was used after its parent {node!r}: a walk must touch the whole path"
                child_locks += child.lock_ref
                stack.append((child, start + len(node.key)))
            if node is root:
                continue
            span = self.span(start, start + len(node.key))
            assert len(node.value) == span, \
                f"{node!r}: {len(node.key)} tokens from position {start} need {span} values, has {len(node.value)}"
            assert node.lock_ref >= 0, f"{node!r}: negative lock_ref"
            assert node.lock_ref >= child_locks, \
                f"{node!r}: lock_ref {node.lock_ref} < sum of children's {child_locks} (a lock skipped an ancestor)"
            if node.lock_ref:
                protected += len(node.value)
            else:
                evictable += len(node.value)
                if not node.children:
                    leaves.add(node)
            for s in node.value:
                assert s not in seen_slots, f"value {s} is held by two nodes"
                seen_slots.add(s)
        assert evictable == self._evictable_size, f"evictable_size {self._evictable_size}, nodes say {evictable}"
        assert protected == self._protected_size, f"protected_size {self._protected_size}, nodes say {protected}"
        assert leaves == self._evictable_leaves, "the evictable-leaf set differs from the unlocked leaves"
