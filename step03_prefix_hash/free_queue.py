"""The free block queue: every block with ref count 0, in eviction order (least recently freed first).

With a prefix cache, a freed block still holds valid K/V and keeps its hash entry, so it is both free and
cached. Three operations must be O(1): `popleft` (the allocator takes the least recently used block and
evicts its entry), `append` (a block's last holder let go: it becomes the most recently used) and
`remove` (a cache hit revives a free block from anywhere in the queue). A deque cannot remove from the
middle in O(1); a doubly linked list can. Like vLLM's FreeKVCacheBlockQueue, links are stored per block
id (here two int arrays, no node objects), with two sentinels so that no operation has a special case.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

_UNLINKED = -1


class FreeBlockQueue:
    """A doubly linked list over block ids 0..num_blocks-1; front = evicted first."""

    def __init__(self, num_blocks: int, blocks: Iterable[int] | None = None) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self._head, self._tail = num_blocks, num_blocks + 1  # sentinels, past the real ids
        self._next = [_UNLINKED] * (num_blocks + 2)
        self._prev = [_UNLINKED] * (num_blocks + 2)
        self._next[self._head], self._prev[self._tail] = self._tail, self._head
        self._len = 0
        for b in range(num_blocks) if blocks is None else blocks:
            self.append(b)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block: int) -> bool:
        return 0 <= block < self.num_blocks and self._next[block] != _UNLINKED

    def __iter__(self) -> Iterator[int]:
        b = self._next[self._head]
        while b != self._tail:
            yield b
            b = self._next[b]

    def popleft(self) -> int:
        """Take the block at the front (least recently freed)."""
        if not self._len:
            raise IndexError("popleft from an empty free block queue")
        # BEGIN SOLUTION task3.free_queue points=2
        block = self._next[self._head]
        after = self._next[block]
        self._next[self._head], self._prev[after] = after, self._head
        self._next[block] = self._prev[block] = _UNLINKED
        self._len -= 1
        return block
        # END SOLUTION

    def append(self, block: int) -> None:
        """Put a block at the back (most recently freed, evicted last)."""
        self._check_id(block)
        if block in self:
            raise ValueError(f"block {block} is already in the free queue")
        # BEGIN SOLUTION task3.free_queue points=2
        last = self._prev[self._tail]
        self._next[last], self._prev[block] = block, last
        self._next[block], self._prev[self._tail] = self._tail, block
        self._len += 1
        # END SOLUTION

    def remove(self, block: int) -> None:
        """Take a block out from anywhere (a cache hit on a free block)."""
        self._check_id(block)
        if block not in self:
            raise ValueError(f"block {block} is not in the free queue")
        # BEGIN SOLUTION task3.free_queue points=2
        before, after = self._prev[block], self._next[block]
        self._next[before], self._prev[after] = after, before
        self._next[block] = self._prev[block] = _UNLINKED
        self._len -= 1
        # END SOLUTION

    def _check_id(self, block: int) -> None:
        if not (isinstance(block, int) and 0 <= block < self.num_blocks):
            raise ValueError(f"block id {block!r} is not in 0..{self.num_blocks - 1}")

    def check_invariants(self) -> None:
        """Links agree both ways, the walk from the front reaches the back in exactly `len` steps, and a
        block is linked exactly when the walk visits it."""
        seen = []
        prev, b = self._head, self._next[self._head]
        while b != self._tail:
            assert 0 <= b < self.num_blocks, f"free queue links to {b}, not a block id"
            assert self._prev[b] == prev, f"free queue: block {b}'s prev is {self._prev[b]}, expected {prev}"
            seen.append(b)
            assert len(seen) <= self._len, "free queue walk is longer than its length (a cycle?)"
            prev, b = b, self._next[b]
        assert self._prev[self._tail] == prev, "free queue: the back sentinel does not point at the last block"
        assert len(seen) == self._len, f"free queue holds {len(seen)} blocks but its length says {self._len}"
        linked = {b for b in range(self.num_blocks) if self._next[b] != _UNLINKED or self._prev[b] != _UNLINKED}
        assert linked == set(seen), f"blocks {sorted(linked ^ set(seen))} are half-linked or linked but unreachable"
