"""BridgeKVCacheManager: the Pico-vLLM write-up's bridge between a token-level radix tree and a block-level
BlockManager (the write-up calls this layer `PrefixCache`).

Three layers, each with one job:

    BlockRadixTree   token granularity: where do prompts share a prefix?   (match_prefix, insert, lock_ref)
         |
    the bridge       aligns to blocks and keeps the two levels of reference counts consistent   (this file)
         |
    BlockManager     block granularity: which blocks are in use?   (allocate, retain, release)

Two reference counts answer two different questions:
- `BlockManager.ref_count[b]` — *may this block be freed?* It counts holders: every live request whose
  block table lists `b`, plus one if the tree holds `b` (the tree is one holder however many of its nodes
  were split around the block). At 0 the block is free. This is the only count that protects data.
- `TreeNode.lock_ref` — *should this prefix stay cached?* It counts live requests whose cached prefix
  runs through the node. It only steers eviction: unlocked leaves go first, least recently used first.

    ref_count[b] = #{live requests r : b in r.block_table} + [b is held by the tree]        (checked)

It is the inode / hard-link split of a file system: the BlockManager is the inode table (an inode is freed
at link count 0), the tree is the directory tree (removing a name does not free a file that is open).

Life of a request (chapter 4's, with blocks and a second count):
1. admission: `get_computed_blocks` matches all but the last token; the tree returns the full blocks on the
   path, so the match is block-aligned by construction. `allocate_slots` locks the node where the match ends,
   takes a reference on each shared block, evicts unlocked leaves if the free list is short, allocates the rest;
2. after each prefill chunk: `cache_unfinished_req` inserts the computed tokens (the tree takes a reference on
   each block it adopts), swaps any block the request computed twice for the tree's copy, and moves the lock;
3. finish, abort or preemption: `cache_finished_req` inserts what was computed, then releases exactly the
   blocks its block table lists — never blocks found by matching its tokens again (the write-up's "release by
   re-match" mistake) — and unlocks.

The host tier (optional, `host_blocks > 0`; see host_pool.py): eviction copies a prefix's blocks to host memory and
files its tokens in a second BlockRadixTree, `host_tree`, instead of forgetting them; a lookup that finds more of
its prompt there than on the device says so (`TieredMatch`), unless the span is too short to beat recomputing it
(`min_load_tokens`), and admission brings those blocks back (`_load_back`). Requests never hold host blocks: the
host tree is their only holder.

The manager is chapter 4's tree manager (`TreeCacheManager`: admission with a lock, the lock's moves, eviction, the
invariants of each request's place in the tree), which does not depend on who counts what. What differs is the
ownership model, and it is all in this file: the request takes a reference on every block it shares, the tree one
on every block it adopts, a duplicate is swapped for the tree's block, and release is by block table; and the host
tier.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from step02_paged.geometry import PoolGeometry
from step02_paged.kv_cache_manager import check_block_tables
from step02_paged.kv_pool import KVPool
from step04_radix.radix_tree import TreeNode
from step04_radix.tree_cache import RadixSequence, TreeCacheManager, TreeMatch

from .block_radix_tree import BlockRadixTree
from .host_pool import HostPool


@dataclass(frozen=True)
class TieredMatch(TreeMatch):
    """A match that continues on the host tier: `blocks` and `node` are the device's; `host_blocks` (host block
    ids) hold the next tokens, up to `host_node` in the host tree. `num_tokens` counts both tiers, so the
    scheduler computes only what neither holds; admission copies the host part in before sharing."""

    host_blocks: tuple[int, ...] = ()
    host_node: TreeNode | None = None


class BridgeKVCacheManager(TreeCacheManager):
    """A BlockRadixTree over a BlockManager of the pool's blocks; `host_blocks` > 0 adds the host tier."""

    design = "bridge"

    def __init__(self, geometry: PoolGeometry, pool: KVPool | None = None, host_blocks: int = 0,
                 min_load_tokens: int = 64) -> None:
        for name, value in (("host_blocks", host_blocks), ("min_load_tokens", min_load_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        super().__init__(geometry, pool, BlockRadixTree(geometry.block_size))
        self.host_blocks, self.min_load_tokens = host_blocks, min_load_tokens
        self.host_tree = BlockRadixTree(geometry.block_size) if host_blocks else None  # what host memory holds
        self.host: HostPool | None = None  # made at the first eviction, on the engine's pool

    # ---- admission ---------------------------------------------------------------------------------------
    def get_computed_blocks(self, seq: RadixSequence) -> TreeMatch:
        """The full blocks of the longest cached prefix (all but the last token may match) and the node where
        the token match ends (chapter 4's lookup). With a host tier, a longer prefix there (long enough to be worth
        copying: `min_load_tokens`) makes a `TieredMatch`, loaded on admission. Looks only, as the interface
        promises: a cache-aware policy may ask about every waiting request."""
        device = super().get_computed_blocks(seq)
        if self.host_tree is not None:
            host_blocks, host_node = self.host_tree.match_prefix(seq.all_token_ids[: seq.num_tokens - 1])
            missing = host_blocks[len(device.blocks):]
            if missing and len(missing) * self.block_size >= self.min_load_tokens:
                return TieredMatch(device.blocks, len(host_blocks) * self.block_size, device.node, tuple(missing),
                                   host_node)
        return device

    def allocate_slots(self, seq: RadixSequence, num_new_tokens: int, match: TreeMatch | None = None) -> bool:
        """Chapter 4's admission; a match with a host part is loaded first (`_load_back`), and then shared like
        any device match."""
        if seq.seq_id not in self.holders and isinstance(match, TieredMatch):
            match = self._load_back(seq, num_new_tokens, match)
            if match is None:
                return False
        return super().allocate_slots(seq, num_new_tokens, match)

    def _share(self, seq: RadixSequence, match: TreeMatch | None) -> None:
        """Level 1 of the count: the request holds each block it shares with the tree."""
        if match:
            self.block_manager.retain(match.blocks)

    def _evict_leaf(self, leaf: TreeNode) -> None:
        """The tree lets go of a leaf: its reference is the only one on a block of an unlocked node, so the block
        is free at once. With a host tier its prefix is copied to host memory first."""
        if self.host_tree is not None:
            blocks = self.tree.prefix_blocks(leaf)
            self._save(self.tree.prefix_tokens(leaf)[: len(blocks) * self.block_size], blocks)
        self.block_manager.release(leaf.value)

    # ---- the host tier -----------------------------------------------------------------------------------
    def _host_pool(self) -> HostPool:
        if self.host is None:
            if self.pool is None:
                raise RuntimeError("the host tier copies K/V: the manager needs the device pool (the engine gives it)")
            self.host = HostPool(self.pool, self.host_blocks)
        return self.host

    def _save(self, tokens: list[int], blocks: list[int]) -> None:
        """File a block-aligned prefix and its device blocks in the host tier: only the blocks the host does not
        hold yet are copied; the host tree's least recently used leaves make room (they are dropped)."""
        host = self._host_pool()
        have, node = self.host_tree.match_prefix(tokens)
        todo = blocks[len(have):]
        if not todo:
            return
        short = len(todo) - host.block_manager.num_free
        if short > 0:
            self.host_tree.inc_lock_ref(node)  # the prefix being extended is not what makes room
            try:
                self.host_tree.evict(short, lambda leaf: host.block_manager.release(leaf.value))
            finally:
                self.host_tree.dec_lock_ref(node)
        todo = todo[: host.block_manager.num_free]
        if todo:
            new = host.block_manager.allocate(len(todo))  # their allocation is the host tree's reference
            host.save(todo, new)
            self.host_tree.insert(tokens[: (len(have) + len(todo)) * self.block_size], have + new)

    def _load_back(self, seq: RadixSequence, num_new_tokens: int, match: TieredMatch) -> TreeMatch | None:
        """Admission of a match with a host part: make room for the host blocks' copies and for the new tokens at
        once, copy the host blocks into new device blocks and give them to the device tree. Returns the device
        match that now covers them, or None when the pool cannot hold both (nothing is loaded)."""
        self._check_match(seq, True, TreeMatch(match.blocks, len(match.blocks) * self.block_size, match.node))
        if not self.host_tree.contains(match.host_node) or \
                self.host_tree.prefix_blocks(match.host_node)[len(match.blocks):] != list(match.host_blocks):
            raise ValueError(f"sequence {seq.seq_id}: stale match, its host part was dropped since the lookup; "
                             "call get_computed_blocks again")
        device_node = match.node or self.tree.root
        need = self.blocks_needed(seq, num_new_tokens, match)  # the host blocks' copies + the new tokens' blocks
        # BEGIN SOLUTION task5.load_back points=3
        bm = self.block_manager
        self.tree.inc_lock_ref(device_node)  # making room must not evict the device part of this very prefix,
        self.host_tree.inc_lock_ref(match.host_node)  # nor the host part we are about to read
        try:
            if need > bm.num_free:
                self.evict(need - bm.num_free)
        finally:
            self.tree.dec_lock_ref(device_node)
            self.host_tree.dec_lock_ref(match.host_node)
        if not bm.can_allocate(need):
            return None
        new = bm.allocate(len(match.host_blocks))  # their allocation becomes the device tree's reference
        self.host.load(list(match.host_blocks), new)
        self.tree.insert(seq.all_token_ids[: match.num_tokens], list(match.blocks) + new)
        return super().get_computed_blocks(seq)
        # END SOLUTION

    # ---- the ownership model: two levels of reference counts -----------------------------------------------
    def _insert(self, seq: RadixSequence) -> int:
        """Insert the computed tokens with the full blocks that hold them. The tree takes a reference on each
        block it adopts, and only on those: a prefix it held already keeps the reference it has.
        Returns how many tokens were inserted (all the computed ones)."""
        # BEGIN SOLUTION task5.insert points=2
        n = seq.num_computed_tokens
        blocks = seq.block_table[: n // self.block_size]
        cached = self.tree.insert(seq.all_token_ids[:n], blocks)
        self.block_manager.retain(blocks[cached // self.block_size:])  # level 2: the tree's reference
        return n
        # END SOLUTION

    def _use_tree_values(self, seq: RadixSequence, start: int, blocks: list[int]) -> None:
        """The table names the tree's blocks from entry `start` on. Where the request computed a block the tree
        already had (two requests prefilled the same prompt at once), it takes a reference on the tree's block and
        drops its own, which frees it."""
        # BEGIN SOLUTION task5.dedup points=2
        own, theirs = seq.block_table[start: len(blocks)], blocks[start:]
        swap = [i for i, (mine, tree_block) in enumerate(zip(own, theirs)) if mine != tree_block]
        self.block_manager.retain([theirs[i] for i in swap])
        self.block_manager.release([own[i] for i in swap])
        seq.rewrite_blocks(start, theirs)
        # END SOLUTION

    def _release(self, seq: RadixSequence, num_inserted: int) -> None:
        """Drop every reference the request holds — the ones in its block table, never blocks found by matching
        its tokens again — tail first."""
        self.block_manager.release(seq.block_table[::-1])

    def reset_cache(self) -> int:
        """Drop every cached block, on both tiers (nobody may hold a lock): the trees' references are released.
        Returns how many device blocks the tree held."""
        dropped = super().reset_cache()
        if self.host is not None:
            self._reset(self.host_tree, self.host.block_manager)
        return dropped

    # ---- accounting --------------------------------------------------------------------------------------
    @property
    def num_cached_blocks(self) -> int:
        return self.tree.total_size

    def _check_ownership(self) -> None:
        """The two-level count (ref_count = block tables listing the block + 1 if the tree holds it); a private
        block is its request's alone, and a block of an unlocked node the tree's alone (evicting it frees memory);
        the host tier's tree is the only holder of host blocks, and nobody locks it."""
        tree, bm = self.tree, self.block_manager
        check_block_tables(list(self.holders.values()), bm, self.block_size, Counter(tree.all_blocks()))
        for seq in self.holders.values():
            for b in self.private_blocks(seq):
                assert bm.ref_count[b] == 1, f"sequence {seq.seq_id}: private block {b} has ref_count {bm.ref_count[b]}"
        for node in tree.nodes():
            if node.lock_ref == 0:
                for b in node.value:
                    assert bm.ref_count[b] == 1, f"block {b} of unlocked {node!r} has ref_count {bm.ref_count[b]}: " \
                                                 "someone uses it without locking its node"
        if self.host is not None:
            self.host_tree.check_invariants()
            self.host.block_manager.check_invariants()
            assert self.host_tree.protected_size == 0, "a host-tier node is still locked"
            held = Counter(self.host_tree.all_blocks())
            for b in range(self.host.block_manager.num_blocks):
                assert self.host.block_manager.ref_count[b] == held.get(b, 0) <= 1, \
                    f"host block {b}: ref_count {self.host.block_manager.ref_count[b]} but the host tree holds it " \
                    f"{held.get(b, 0)} times"
