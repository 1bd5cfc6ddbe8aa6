"""PrefixCachingBlockManager: chapter 2's allocator plus a hash -> block map (vLLM's BlockPool).

A full, computed block is *published* under its chained hash. From then on it is found by hash until
the allocator reuses it. Freeing does not forget: a block whose ref count drops to 0 keeps its hash
entry and waits in the LRU free queue, still reusable. Only `allocate` — chapter 2's allocator taking the
least recently used free blocks for new tokens — evicts: that is the moment their hash entries are dropped.

A hit on a block goes through `touch`: ref +1, and if the block was free it leaves the free queue, so no
allocation can take it while it is in use. Every public method validates first and mutates after.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from step02_paged.block_manager import BlockManager

from .block_hash import BlockHash, hash_block_tokens
from .free_queue import FreeBlockQueue


@dataclass(frozen=True)
class CacheEntry:
    """What a cached block holds: its hash, its parent's hash (None under the root) and its content. The
    content is kept for the invariants (the hash is recomputed from it) and for the pictures."""

    block_hash: BlockHash
    parent: BlockHash | None
    token_ids: tuple[int, ...]
    extra_keys: tuple = ()


class PrefixCachingBlockManager(BlockManager):
    """Reference counts, an O(1) LRU free queue, and the hash -> block map of published blocks."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.free_blocks = FreeBlockQueue(num_blocks)  # instead of chapter 2's deque: hits remove from the middle
        self.cached: dict[BlockHash, int] = {}  # hash -> the block that holds that content
        self.entries: list[CacheEntry | None] = [None] * num_blocks  # block -> its entry, if published
        self.num_evicted = 0

    @property
    def num_cached(self) -> int:
        return len(self.cached)

    def get_cached_block(self, block_hash: BlockHash) -> int | None:
        return self.cached.get(block_hash)

    def cache_block(self, block: int, entry: CacheEntry) -> bool:
        """Publish a full, computed block held by the caller. Returns False, caching nothing, when another
        block already holds this content (two requests computed the same prefix at the same time): the
        first stays the one that is found; this block stays private and is freed like any other."""
        self._check_id(block)
        if self.ref_count[block] == 0:
            raise ValueError(f"block {block} is free; only a held block can be published")
        old = self.entries[block]
        if old is not None:
            if old.block_hash != entry.block_hash:
                raise ValueError(f"block {block} is already cached with other content ({old.block_hash.hex()[:6]})")
            return True
        if entry.block_hash in self.cached:
            return False
        self.entries[block] = entry
        self.cached[entry.block_hash] = block
        return True

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a hold on cache hits: ref +1 each; a hit that was free leaves the free queue first. Only a
        held or a cached block can be touched (a free block without an entry holds nothing worth reading)."""
        for b in blocks:
            self._check_id(b)
            if self.ref_count[b] == 0 and self.entries[b] is None:
                raise ValueError(f"block {b} is free and not cached: nothing to reuse")
        # BEGIN SOLUTION task3.touch_evict points=2
        for b in blocks:
            if self.ref_count[b] == 0:
                self.free_blocks.remove(b)
            self.ref_count[b] += 1
        # END SOLUTION

    def allocate(self, n: int) -> list[int]:
        """Chapter 2's allocation, from the front of the LRU free queue. A block taken that was still cached is
        evicted now: its hash entry goes, since new tokens will overwrite its K/V."""
        blocks = super().allocate(n)
        # BEGIN SOLUTION task3.touch_evict points=2
        for block in blocks:
            entry = self.entries[block]
            if entry is not None:
                del self.cached[entry.block_hash]
                self.entries[block] = None
                self.num_evicted += 1
        # END SOLUTION
        return blocks

    def reset(self) -> int:
        """Forget every cached block (e.g. after a weight update); only when no block is held. Returns how
        many entries were dropped. Raises RuntimeError, changing nothing, while any block is in use."""
        held = sum(1 for c in self.ref_count if c)
        if held:
            raise RuntimeError(f"cannot reset the prefix cache while {held} blocks are held by running requests; "
                               "finish or abort them first")
        dropped = len(self.cached)
        self.cached.clear()
        self.entries = [None] * self.num_blocks
        return dropped

    def check_invariants(self) -> None:
        """Chapter 2's (free exactly when ref 0), the free queue's links, and the map and the entries
        describing the same blocks, each entry's hash matching its content."""
        super().check_invariants()
        self.free_blocks.check_invariants()
        assert len(self.cached) == sum(e is not None for e in self.entries), \
            "the hash map and the per-block entries disagree on how many blocks are cached"
        for h, b in self.cached.items():
            entry = self.entries[b]
            assert entry is not None and entry.block_hash == h, f"hash {h.hex()[:6]} maps to block {b}, which is " \
                f"cached as {entry.block_hash.hex()[:6] if entry else 'nothing'}"
            assert hash_block_tokens(entry.parent, entry.token_ids, entry.extra_keys) == h, \
                f"block {b}: its hash does not match its parent and tokens"
