"""RadixKVCacheManager: SGLang's radix cache as the engine's cache manager, one token per slot.

It is chapter 4's tree manager (tree_cache.py: admission with a lock, the lock's moves, eviction, the invariants
of each request's place in the tree) over a BlockManager of block_size 1, so a block is a slot, with SGLang's
ownership model: every slot of the pool has exactly one owner.
- the tree owns the slots of the tokens it caches (`insert` hands them over);
- a request owns the slots it allocated that are not in the tree yet (its *private* slots);
- the rest are on the free list.
The BlockManager keeps counting: a slot's ref_count is 1 when it has an owner and 0 when free. Sharing a cached
prefix adds no count: the request locks the tree node where its prefix ends, and a locked node is never evicted.

A request's block table therefore reads: `block_table[:cache_protected_len]` = the tree's slots along the path
to `last_node` (locked), `block_table[cache_protected_len:]` = private slots. When a prefill chunk joins the tree,
the request frees its slots of tokens the tree already had (duplicates) and its table names the tree's instead;
when it finishes, it frees the slots it allocated but never wrote.
"""
from __future__ import annotations

from collections import Counter

from step02_paged.geometry import PoolGeometry
from step02_paged.kv_pool import KVPool

from .radix_tree import RadixTree, TreeNode
from .tree_cache import RadixSequence, TreeCacheManager, TreeMatch

__all__ = ["RadixKVCacheManager", "RadixSequence", "TreeMatch"]


class RadixKVCacheManager(TreeCacheManager):
    """A slot pool whose finished and in-flight prefixes live in a RadixTree."""

    design = "radix"

    def __init__(self, geometry: PoolGeometry, pool: KVPool | None = None) -> None:
        if geometry.block_size != 1:
            raise ValueError(f"the radix cache stores one token per slot: block_size must be 1, "
                             f"got {geometry.block_size}")
        super().__init__(geometry, pool, RadixTree())

    # ---- the ownership model: one owner per slot ---------------------------------------------------------
    def _share(self, seq: RadixSequence, match: TreeMatch | None) -> None:
        """The lock is all: the tree keeps owning the slots the request reads."""

    def _insert(self, seq: RadixSequence) -> int:
        """Insert the computed tokens; free the private slots of tokens the tree already had. Returns how many
        tokens were inserted (all the computed ones)."""
        n = seq.num_computed_tokens
        slots = seq.block_table[:n]
        cached = self.tree.insert(seq.all_token_ids[:n], slots)
        self.block_manager.release(slots[seq.cache_protected_len: cached])  # duplicates of the tree's slots
        return n

    def _use_tree_values(self, seq: RadixSequence, start: int, values: list[int]) -> None:
        """The duplicates were freed by the insert: the table names the tree's slots instead."""
        seq.rewrite_blocks(start, values[start:])

    def _release(self, seq: RadixSequence, num_inserted: int) -> None:
        """The tree owns the inserted tokens' slots now: free only those allocated but never written, tail first."""
        self.block_manager.release(seq.block_table[num_inserted:][::-1])

    def _evict_leaf(self, leaf: TreeNode) -> None:
        self.block_manager.release(leaf.value)

    def _check_ownership(self) -> None:
        """Every slot has exactly one owner among the tree, one request (its private slots) and the free list,
        and ref_count 1 exactly when owned."""
        bm = self.block_manager
        owned: Counter = Counter(self.tree.all_slots())
        for seq in self.holders.values():
            assert seq.num_computed_tokens <= len(seq.block_table) <= seq.num_positions, \
                f"sequence {seq.seq_id}: {len(seq.block_table)} slots, not between its {seq.num_computed_tokens} " \
                f"computed tokens and its {seq.num_positions} positions (tokens and drafts)"
            owned.update(self.private_blocks(seq))
        free = set(bm.free_blocks)
        for slot in range(self.num_blocks):
            owners = owned.get(slot, 0) + (slot in free)
            assert owners == 1, f"slot {slot} has {owners} owners among the tree, the requests and the free list"
            assert bm.ref_count[slot] == owned.get(slot, 0), \
                f"slot {slot}: ref_count {bm.ref_count[slot]} but {owned.get(slot, 0)} owners"
