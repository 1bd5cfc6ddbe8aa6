"""Stand-ins for chapter 3's homework bodies, written for its tests, so that each task is graded on its own: a test
that uses the `alone` fixture (conftest.py) runs the bodies of the tasks it is tagged with as they are written, and
in place of the chapter's other bodies the plain versions below, patched in for that test only. Chapter 2 runs as
written (an earlier chapter).

The plain versions say what a correct body does, as plainly as is clear, and slowly where that is clearer: the hash
is SHA-256 of a repr, the free queue a Python list, each lookup a walk from the first block, the common prefix a
comparison of every block table.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence

import pytest

from step02_paged import PrefixMatch
from step02_paged.block_manager import BlockManager
from step03_prefix_hash import block_hash as block_hash_module
from step03_prefix_hash import block_manager as block_manager_module
from step03_prefix_hash import sequence as sequence_module
from step03_prefix_hash.block_hash import NONE_HASH, BlockHash, block_extra_keys
from step03_prefix_hash.block_manager import CacheEntry, PrefixCachingBlockManager
from step03_prefix_hash.kv_cache_manager import PrefixCachingKVCacheManager
from step03_prefix_hash.sequence import HashedSequence


# ---- task3.block_hash ----------------------------------------------------------------------------------------
def chained_hash(parent: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    """A block's name: any function of its parent's name, its token ids and its extra keys that tells them apart
    serves the cache. Here 32 bytes of SHA-256 over the parent's digest and a repr of the rest."""
    seed = NONE_HASH if parent is None else parent
    return hashlib.sha256(seed + repr(([int(t) for t in token_ids], extra_keys)).encode()).digest()


def update_block_hashes(self: HashedSequence) -> None:
    """Every full block's hash, recomputed from the first block on each call (the sequence keeps the list)."""
    self.block_hashes[:] = block_hash_module.hash_token_blocks(self.all_token_ids, self.block_size, self.cache_salt)


# ---- task3.free_queue ----------------------------------------------------------------------------------------
class ListFreeQueue:
    """The free queue as a Python list, front first (O(n) where the chapter's is O(1): tests do not mind)."""

    def __init__(self, num_blocks: int, blocks: Iterable[int] | None = None) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.order = list(range(num_blocks) if blocks is None else blocks)

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, block: int) -> bool:
        return block in self.order

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.order))

    def popleft(self) -> int:
        if not self.order:
            raise IndexError("popleft from an empty free block queue")
        return self.order.pop(0)

    def append(self, block: int) -> None:
        if not 0 <= block < self.num_blocks or block in self.order:
            raise ValueError(f"block {block} is not a block id or already in the free queue")
        self.order.append(block)

    def remove(self, block: int) -> None:
        if block not in self.order:
            raise ValueError(f"block {block} is not in the free queue")
        self.order.remove(block)

    def check_invariants(self) -> None:
        assert len(set(self.order)) == len(self.order), f"a block twice in the free queue: {self.order}"


# ---- task3.touch_evict ---------------------------------------------------------------------------------------
def touch(self: PrefixCachingBlockManager, blocks: Sequence[int]) -> None:
    """Validate every block first; then each hit is held once more, and leaves the free queue if it was there."""
    for b in blocks:
        self._check_id(b)
        if self.ref_count[b] == 0 and self.entries[b] is None:
            raise ValueError(f"block {b} is free and not cached: nothing to reuse")
    for b in blocks:
        if b in self.free_blocks:
            self.free_blocks.remove(b)
        self.ref_count[b] = self.ref_count[b] + 1


def allocate(self: PrefixCachingBlockManager, n: int) -> list[int]:
    """Chapter 2's allocation; then every block taken forgets the content it cached, if any."""
    taken = BlockManager.allocate(self, n)
    evicted = [b for b in taken if self.entries[b] is not None]
    for name in [h for h, b in self.cached.items() if b in evicted]:
        self.cached.pop(name)
    for b in evicted:
        self.entries[b] = None
    self.num_evicted += len(evicted)
    return taken


# ---- task3.lookup, task3.publish, task3.common_prefix -----------------------------------------------------------
def get_computed_blocks(self: PrefixCachingKVCacheManager, seq: HashedSequence) -> PrefixMatch:
    """Walk the sequence's hashes from the first, while each is cached, leaving the last token uncovered."""
    found: list[int] = []
    limit = min(len(seq.block_hashes), (seq.num_tokens - 1) // self.block_size)
    while len(found) < limit:
        block = self.block_manager.get_cached_block(seq.block_hashes[len(found)])
        if block is None:
            break
        found.append(block)
    return PrefixMatch(tuple(found), self.block_size * len(found))


def on_computed(self: PrefixCachingKVCacheManager, seq: HashedSequence) -> None:
    """Publish, one at a time from the first not yet published, each block that is full and computed."""
    n, size = self._num_published.get(seq.seq_id, 0), self.block_size
    while n < len(seq.block_hashes) and (n + 1) * size <= seq.num_computed_tokens:
        content = tuple(seq.all_token_ids[n * size: n * size + size])
        parent = None if n == 0 else seq.block_hashes[n - 1]
        self.block_manager.cache_block(seq.block_table[n], CacheEntry(seq.block_hashes[n], parent, content,
                                                                      block_extra_keys(n, seq.cache_salt)))
        n += 1
    self._num_published[seq.seq_id] = n


def num_common_prefix_blocks(self: PrefixCachingKVCacheManager, seq: HashedSequence) -> int:
    """The leading positions where every holder's block table lists the same block as `seq`'s (compared)."""
    tables = [s.block_table for s in self.holders.values()]
    n = 0
    while n < len(seq.block_table) and all(n < len(t) and t[n] == seq.block_table[n] for t in tables):
        n += 1
    return n


# task -> (object, attribute, stand-in) patched in place of the task's bodies
STAND_INS = {
    "task3.block_hash": [(block_hash_module, "hash_block_tokens", chained_hash),
                         (block_manager_module, "hash_block_tokens", chained_hash),
                         (sequence_module, "hash_block_tokens", chained_hash),
                         (HashedSequence, "update_block_hashes", update_block_hashes)],
    "task3.free_queue": [(block_manager_module, "FreeBlockQueue", ListFreeQueue)],
    "task3.touch_evict": [(PrefixCachingBlockManager, "touch", touch),
                          (PrefixCachingBlockManager, "allocate", allocate)],
    "task3.lookup": [(PrefixCachingKVCacheManager, "get_computed_blocks", get_computed_blocks)],
    "task3.publish": [(PrefixCachingKVCacheManager, "on_computed", on_computed)],
    "task3.common_prefix": [(PrefixCachingKVCacheManager, "num_common_prefix_blocks", num_common_prefix_blocks)],
}


def use_stand_ins(monkeypatch: pytest.MonkeyPatch, keep: Iterable[str]) -> None:
    """Every chapter-3 body as its stand-in, except those of the tasks in `keep`, until the test ends."""
    keep = set(keep)
    for task, patches in STAND_INS.items():
        if task not in keep:
            for owner, name, stand_in in patches:
                monkeypatch.setattr(owner, name, stand_in)
