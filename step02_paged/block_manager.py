"""BlockManager: the physical page allocator of the KV pool.

KV memory is cut into `num_blocks` fixed-size blocks. A block is handed out from a free list in O(1) and
carries a reference count: how many holders (the block tables that list it) use it.
It returns to the free list only when its count reaches zero. `retain` and `release` are symmetric and
are the only way to change a count — callers never touch `ref_count` themselves (the mini-vllm tutorial's step14_6).

Every public method validates first and mutates after, so a failed call leaves the state unchanged.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence


class OutOfBlocksError(RuntimeError):
    """Not enough free blocks (nothing was allocated). The cache managers ask `can_allocate` first and answer
    False instead, which is what makes the scheduler preempt; reaching this error is a bug in the caller."""


class BlockManager:
    """Free list + reference counts over block ids 0..num_blocks-1."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_count = [0] * num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks, each with ref_count 1. Raises OutOfBlocksError (state unchanged) if too few are free."""
        # BEGIN SOLUTION task2.allocate_free points=2
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if not self.can_allocate(n):
            raise OutOfBlocksError(f"need {n} blocks, only {self.num_free} free")
        blocks = [self.free_blocks.popleft() for _ in range(n)]
        for b in blocks:
            self.ref_count[b] = 1
        return blocks
        # END SOLUTION

    def retain(self, blocks: Iterable[int]) -> None:
        """One more holder for each block already held by someone (sharing never resurrects a free block)."""
        blocks = list(blocks)
        for b in blocks:
            self._check_id(b)
            if self.ref_count[b] == 0:
                raise ValueError(f"block {b} is free; allocate it instead of retaining it")
        for b in blocks:
            self.ref_count[b] += 1

    def release(self, blocks: Sequence[int]) -> list[int]:
        """One holder fewer for each block; blocks that reach 0 go back to the free list. Returns those."""
        # BEGIN SOLUTION task2.allocate_free points=2
        pending: dict[int, int] = {}
        for b in blocks:
            self._check_id(b)
            pending[b] = pending.get(b, 0) + 1
            if pending[b] > self.ref_count[b]:
                raise ValueError(f"release of block {b} below zero (ref_count {self.ref_count[b]}): "
                                 "double free, or a block released by someone who never held it")
        freed = []
        for b in blocks:
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.free_blocks.append(b)
                freed.append(b)
        return freed
        # END SOLUTION

    def _check_id(self, b: int) -> None:
        if not (isinstance(b, int) and 0 <= b < self.num_blocks):
            raise ValueError(f"block id {b!r} is not in 0..{self.num_blocks - 1}")

    def check_invariants(self) -> None:
        """Counts never negative; a block is free exactly when its count is 0; no block listed twice."""
        free = list(self.free_blocks)
        assert len(free) == len(set(free)), "free list holds a block twice"
        assert all(c >= 0 for c in self.ref_count), "negative ref_count"
        free_set = set(free)
        for b, c in enumerate(self.ref_count):
            assert (c == 0) == (b in free_set), f"block {b}: ref_count {c} but {'' if b in free_set else 'not '}free"
