"""TreeCacheManager: what every cache manager with a radix tree in front of a BlockManager does the same way.

This chapter's radix cache (one token per slot) and chapter 5's bridge (a token tree over blocks of several
tokens) differ only in who counts what. Everything else is written once, here:
- a request's place in the tree: `RadixSequence.last_node`, the node where its cached prefix ends, locked
  (`lock_ref` along the parent chain), and `cache_protected_len`, that prefix's tokens, whose values (slots or
  blocks) head its block table. The lock is the request's only reference to the tree: a node pointer, never a
  token path (locking by token path is the design mistake tests/step04 replays);
- admission (`allocate_slots`): the match's node is locked before anything can be evicted, unlocked leaves are
  evicted least recently used first when the free list is short, the rest is allocated; all or nothing;
- after each prefill chunk (`on_computed` → `cache_unfinished_req`): the computed tokens join the tree at once,
  so that requests arriving meanwhile share them, and the lock moves down to where they end;
- finish, abort or preemption (`free` → `cache_finished_req`): the computed tokens join the tree, the request
  lets go of what it holds and unlocks; its tokens stay cached, evictable, until memory is needed;
- the invariants that tie each request to its place in the tree.

A design says who owns what in five methods (its ownership model), and in its own `check_invariants`:
    `_share(seq, match)`                 on admission, what the request takes on the values it shares;
    `_insert(seq)`                       the computed tokens join the tree: who owns the values it adopts;
    `_use_tree_values(seq, start, vals)` after that, the block table names the tree's values from `start` on;
    `_release(seq, num_inserted)`        on finish, the request lets go of the values it still holds;
    `_evict_leaf(leaf)`                  the tree drops a leaf: its values are freed.
"""
from __future__ import annotations

from abc import abstractmethod
from collections import Counter
from dataclasses import dataclass

from step01_kvcache.request import SamplingParams
from step02_paged.block_manager import BlockManager
from step02_paged.cache_manager import CacheManager, PrefixMatch, SharedPrefix
from step02_paged.geometry import PoolGeometry
from step02_paged.kv_cache_manager import check_slot_usage
from step02_paged.kv_pool import KVPool
from step02_paged.sequence import Sequence

from .radix_tree import RadixTree, TreeNode


@dataclass(eq=False)
class RadixSequence(Sequence):
    """A chapter 2 Sequence that also remembers its place in the radix tree."""

    last_node: TreeNode | None = None  # locked: where the part of block_table owned by the tree ends
    cache_protected_len: int = 0  # tokens of the locked prefix; their values head the block table
    num_prefill_tokens: int = 0  # tokens to prefill when admitted: later forwards beyond it are decodes


@dataclass(frozen=True)
class TreeMatch(PrefixMatch):
    """A lookup's answer: the values of the cached prefix and the node where it ends (locked on admission)."""

    node: TreeNode | None = None


class TreeCacheManager(CacheManager):
    """A RadixTree (`tree`) whose values are ids of a BlockManager's blocks, and the requests that lock its nodes."""

    def __init__(self, geometry: PoolGeometry, pool: KVPool | None, tree: RadixTree) -> None:
        super().__init__(geometry, pool)
        self.block_manager = BlockManager(geometry.num_blocks)
        self.tree = tree
        self.num_evicted = 0  # values taken back from the tree under memory pressure

    def new_sequence(self, seq_id: int, prompt_ids: list[int], params: SamplingParams) -> RadixSequence:
        return RadixSequence(seq_id, prompt_ids, params)

    # ---- admission ---------------------------------------------------------------------------------------
    def get_computed_blocks(self, seq: RadixSequence) -> TreeMatch:
        """The values of the longest cached prefix, leaving at least the last token to compute, and the node where
        the token match ends. A path holds the values of its whole blocks only, so the match is block-aligned."""
        values, node = self.tree.match_prefix(seq.all_token_ids[: seq.num_tokens - 1])
        return TreeMatch(tuple(values), len(values) * self.block_size, node)

    def allocate_slots(self, seq: RadixSequence, num_new_tokens: int, match: TreeMatch | None = None) -> bool:
        """All or nothing. On admission the matched node is locked first (so that the eviction that may follow
        cannot take it) and the block table starts with the match's values, which the request then shares
        (`_share`); then LRU leaves are evicted if the free list is short, and the missing values allocated."""
        admitting = seq.seq_id not in self.holders
        self._check_match(seq, admitting, match)
        need = self.blocks_needed(seq, num_new_tokens, match)
        if not need and not admitting:  # a decode whose last block still has room
            return True
        node = match.node if match and match.blocks else self.tree.root
        if admitting:
            self.tree.inc_lock_ref(node)
        new = None
        try:
            if need > self.block_manager.num_free:
                self.evict(need - self.block_manager.num_free)
            if self.block_manager.can_allocate(need):
                new = self.block_manager.allocate(need)
        finally:
            if admitting and new is None:  # refused, or the eviction or the allocation raised: the lock goes too
                self.tree.dec_lock_ref(node)
        if new is None:
            return False
        if admitting:  # only now does the request hold anything: a failure above left it out of the tree's books
            seq.block_table = list(match.blocks) if match else []
            seq.last_node, seq.cache_protected_len = node, self.tree.depth(node)
            seq.num_prefill_tokens = seq.num_tokens
            self.holders[seq.seq_id] = seq
            self._share(seq, match)
        seq.block_table.extend(new)
        return True

    def _check_match(self, seq: RadixSequence, admitting: bool, match: TreeMatch | None) -> None:
        """Refuse, changing nothing, a match that is not this admission's, or that went stale: between the lookup
        and the allocation another admission may have evicted the matched node."""
        if not (match and match.blocks):
            return
        if not admitting:
            raise ValueError(f"sequence {seq.seq_id}: a match is taken only on admission")
        node, tree = match.node, self.tree
        if node is None or not tree.contains(node) or tree.prefix_slots(node) != list(match.blocks) \
                or tree.prefix_tokens(node) != seq.all_token_ids[: tree.depth(node)]:
            raise ValueError(f"sequence {seq.seq_id}: stale match, its node was evicted since the lookup; "
                             "call get_computed_blocks again")

    def evict(self, num: int) -> int:
        """Free at least `num` values from unlocked leaves, least recently used first (fewer if the tree holds
        fewer unlocked ones). Returns the number freed."""
        freed = self.tree.evict(num, self._evict_leaf)
        self.num_evicted += freed
        return freed

    # ---- caching computed tokens -------------------------------------------------------------------------
    def on_computed(self, seq: RadixSequence) -> None:
        """After a prefill chunk (not after a decode step) the computed tokens join the tree at once, so that
        requests arriving meanwhile can share them."""
        if seq.num_computed_tokens <= seq.num_prefill_tokens:
            self.cache_unfinished_req(seq)

    def cache_unfinished_req(self, seq: RadixSequence) -> None:
        """Give the computed prefix to the tree and keep using it through a lock on its last node; the head of
        the block table then names the tree's values."""
        start = seq.cache_protected_len // self.block_size  # the table names the tree's values up to here already
        values = self._move_lock(seq, self._insert(seq))
        self._use_tree_values(seq, start, values)

    def _move_lock(self, seq: RadixSequence, num_tokens: int) -> list[int]:
        """Lock the node where the sequence's first `num_tokens` tokens end (they were just inserted) and unlock
        the one it held. Returns the values on the path to the new node."""
        values, node = self.tree.match_prefix(seq.all_token_ids[:num_tokens])
        assert self.tree.depth(node) == num_tokens, "the tokens just inserted must match in full"
        self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(seq.last_node)
        seq.last_node, seq.cache_protected_len = node, num_tokens
        return values

    def cache_finished_req(self, seq: RadixSequence) -> None:
        """Give every computed token to the tree, let go of the rest, and unlock."""
        self._release(seq, self._insert(seq))
        self.tree.dec_lock_ref(seq.last_node)
        seq.block_table, seq.last_node, seq.cache_protected_len = [], None, 0

    def free(self, seq: RadixSequence) -> None:
        """Finish, abort or preemption: what the sequence computed stays cached (a preempted sequence will usually
        find it again when it is re-admitted)."""
        if seq.seq_id in self.holders:
            self.cache_finished_req(seq)
            del self.holders[seq.seq_id]

    def reset_cache(self) -> int:
        """Drop every cached token (nobody may hold a lock): the tree's values go back. Returns how many."""
        return self._reset(self.tree, self.block_manager)

    def _reset(self, tree: RadixTree, block_manager: BlockManager) -> int:
        """Forget everything `tree` caches and give its values back to `block_manager`; only while no request uses
        the cache (RuntimeError otherwise, nothing changed). Returns how many values were released."""
        if self.holders or tree.protected_size:
            raise RuntimeError(f"cannot reset the prefix cache while {len(self.holders)} requests use it; "
                               "finish or abort them first")
        values = tree.all_slots()
        block_manager.release(values)
        tree.reset()
        return len(values)

    # ---- what running requests share ---------------------------------------------------------------------
    def shared_prefixes(self, seqs: list[RadixSequence], min_blocks: int = 1) -> list[SharedPrefix]:
        """Groups of `seqs` that share a tree node whose path holds at least `min_blocks` values, read from the paths
        their locks run along (the nodes `lock_ref` counts): no new bookkeeping. Top down, a node that two or more
        of `seqs` pass through is followed down while all of them still do; where they part (their deepest common
        node) they form one group if the path is long enough, and otherwise the search goes on among them below.
        Every group is as large as it can be: two system prompts in one batch make two groups, where a prefix
        common to the whole batch would find none."""
        paths = {seq.seq_id: self.tree.path(seq.last_node) for seq in seqs}
        through: Counter = Counter(node.id for path in paths.values() for node in path)
        below: dict[int, list[TreeNode]] = {}  # node id -> its children on some path, in creation order
        for node in sorted({node for path in paths.values() for node in path}, key=lambda n: n.id):
            below.setdefault(node.parent.id, []).append(node)
        groups, todo = [], list(below.get(self.tree.root.id, ()))
        while todo:
            node = todo.pop(0)
            if through[node.id] < 2:
                continue
            while (same := [c for c in below.get(node.id, ()) if through[c.id] == through[node.id]]):
                node = same[0]  # all of them go on through this child
            blocks = self.tree.span(0, self.tree.depth(node))
            if blocks >= min_blocks:
                groups.append(SharedPrefix(tuple(s for s in seqs if node in paths[s.seq_id]), blocks))
            else:
                todo += below.get(node.id, ())
        return groups

    # ---- the ownership model: what a design defines ------------------------------------------------------
    @abstractmethod
    def _share(self, seq: RadixSequence, match: TreeMatch | None) -> None:
        """On admission, after the block table starts with the match's values."""

    @abstractmethod
    def _insert(self, seq: RadixSequence) -> int:
        """Insert the computed tokens with their values; returns how many tokens were inserted."""

    @abstractmethod
    def _use_tree_values(self, seq: RadixSequence, start: int, values: list[int]) -> None:
        """After an insert of an unfinished request: its table names the tree's `values` from entry `start` on."""

    @abstractmethod
    def _release(self, seq: RadixSequence, num_inserted: int) -> None:
        """On finish, after the insert of its first `num_inserted` tokens: let go of what the request holds."""

    @abstractmethod
    def _evict_leaf(self, leaf: TreeNode) -> None:
        """The tree drops `leaf` (still attached): free its values."""

    # ---- accounting --------------------------------------------------------------------------------------
    def private_blocks(self, seq: RadixSequence) -> list[int]:
        """The part of the block table after the tree's values of the locked prefix: the request's own."""
        return seq.block_table[seq.cache_protected_len // self.block_size:]

    def num_held_blocks(self) -> int:
        """Values live requests use: all but the free ones and those of unlocked nodes, whose only holder is the
        tree (reclaimable, as chapter 3's free cached blocks are)."""
        return self.num_blocks - self.block_manager.num_free - self.tree.evictable_size

    def check_invariants(self) -> None:
        """The tree's and the BlockManager's; each request's place in the tree and the lock counts; the usage
        counts; then the design's ownership model (`_check_ownership`)."""
        self.tree.check_invariants()
        self.block_manager.check_invariants()
        self._check_tree_holders()
        check_slot_usage(self)
        self._check_ownership()

    def _check_tree_holders(self) -> None:
        """Each live request's place in the tree: its last_node is attached, at the depth it believes, on its own
        prefix, and its block table starts with the values along that path; each lock_ref counts the requests
        whose locked path runs through the node."""
        tree, locks = self.tree, Counter()
        for seq in self.holders.values():
            node = seq.last_node
            assert not seq.is_finished, f"finished sequence {seq.seq_id} still holds values"
            assert node is not None and tree.contains(node), f"sequence {seq.seq_id} holds no node of the tree"
            assert seq.cache_protected_len == tree.depth(node), \
                f"sequence {seq.seq_id}: cache_protected_len {seq.cache_protected_len} != depth of its last_node"
            assert seq.block_table[: tree.span(0, seq.cache_protected_len)] == tree.prefix_slots(node), \
                f"sequence {seq.seq_id}: block table does not start with the tree's values of its prefix"
            assert seq.all_token_ids[: seq.cache_protected_len] == tree.prefix_tokens(node), \
                f"sequence {seq.seq_id}: its last_node's path is not its own prefix"
            locks.update(n.id for n in tree.path(node))
        for node in tree.nodes():
            assert node.lock_ref == locks.get(node.id, 0), \
                f"{node!r}: lock_ref {node.lock_ref} but {locks.get(node.id, 0)} live requests lock it"

    @abstractmethod
    def _check_ownership(self) -> None:
        """The design's rule of who holds each value; AssertionError names the broken one."""
