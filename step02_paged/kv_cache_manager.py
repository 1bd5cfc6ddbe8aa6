"""KVCacheManager: gives each sequence the blocks it needs, step by step, through the BlockManager.

It is the one object the scheduler asks about memory, with vLLM v1's three questions:
`get_computed_blocks` (what of this prompt is already in the pool? — nothing here; a prefix cache from
chapter 3 on), `allocate_slots` (make room for n more tokens, all or nothing) and `free`. Later chapters
subclass it and change only those answers; the scheduler and engine stay as they are.
"""
from __future__ import annotations

from collections import Counter

from course.draw import Dot

from .block_manager import BlockManager
from .sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Block tables over a BlockManager; a sequence holds at most ceil(tokens / block_size) blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.block_manager = self._make_block_manager(num_blocks)
        self.holders: dict[int, Sequence] = {}  # sequences that hold blocks, by id

    def _make_block_manager(self, num_blocks: int) -> BlockManager:
        return BlockManager(num_blocks)

    @property
    def num_blocks(self) -> int:
        return self.block_manager.num_blocks

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[int], int]:
        """Blocks already holding a prefix of `seq`, and how many tokens they cover. Paging alone: none."""
        return [], 0

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] = (),
                       num_computed_tokens: int = 0) -> bool:
        """Grow `seq.block_table` to cover its computed tokens + `num_new_tokens`. On a sequence's admission
        `computed_blocks` (from get_computed_blocks) are shared first. All or nothing: False changes nothing."""
        # BEGIN SOLUTION task2.allocate_slots points=3
        total = (num_computed_tokens if computed_blocks else seq.num_computed_tokens) + num_new_tokens
        need = max(0, cdiv(total, self.block_size) - len(seq.block_table) - len(computed_blocks))
        # a shared block with ref_count 0 (a cached free block, chapter 3) leaves the free pool when shared
        revived = sum(1 for b in computed_blocks if self.block_manager.ref_count[b] == 0)
        if not self.block_manager.can_allocate(need + revived):
            return False
        if computed_blocks:
            self._share(computed_blocks)
            seq.block_table = list(computed_blocks)
            seq.num_computed_tokens = num_computed_tokens
            if not seq.num_preemptions:  # a recompute's own blocks found again are not prompt-cache hits
                seq.num_cached_tokens = num_computed_tokens
        seq.block_table += self.block_manager.allocate(need)
        self.holders[seq.seq_id] = seq
        return True
        # END SOLUTION

    def _share(self, blocks: list[int]) -> None:
        """Take a hold on blocks that already contain this sequence's prefix."""
        self.block_manager.retain(blocks)

    def on_computed(self, seq: Sequence) -> None:
        """Called after each forward that advanced `seq` (a prefix cache publishes filled blocks here)."""

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's hold on its blocks (finish, abort or preemption). Tail blocks first, so that a
        cache that evicts least-recently-freed blocks first drops a prefix's end before its start."""
        self.block_manager.release(seq.block_table[::-1])
        seq.block_table = []
        self.holders.pop(seq.seq_id, None)

    def expected_ref_counts(self) -> Counter:
        """Who should hold each block: one count per sequence whose block table lists it."""
        return Counter(b for seq in self.holders.values() for b in seq.block_table)

    def slot_usage(self) -> tuple[int, int]:
        """(allocated slots, filled slots) over blocks in use. A block shared by several sequences counts once,
        filled as far as its fullest holder wrote it."""
        fill: dict[int, int] = {}
        for seq in self.holders.values():
            for i, b in enumerate(seq.block_table):
                written = min(self.block_size, max(0, seq.num_computed_tokens - i * self.block_size))
                fill[b] = max(fill.get(b, 0), written)
        return len(fill) * self.block_size, sum(fill.values())

    def check_invariants(self) -> None:
        self.block_manager.check_invariants()
        for seq in self.holders.values():
            assert not seq.is_finished, f"finished sequence {seq.seq_id} still holds blocks"
            assert len(seq.block_table) <= cdiv(seq.num_tokens, self.block_size), \
                f"sequence {seq.seq_id} holds {len(seq.block_table)} blocks for {seq.num_tokens} tokens"
            assert seq.num_computed_tokens <= len(seq.block_table) * self.block_size, \
                f"sequence {seq.seq_id}: computed tokens beyond its blocks"
        expected = self.expected_ref_counts()
        for b in range(self.num_blocks):
            assert self.block_manager.ref_count[b] == expected.get(b, 0), \
                f"block {b}: ref_count {self.block_manager.ref_count[b]} but {expected.get(b, 0)} holders"

    def occupancy_map(self) -> str:
        """One character per pool block: the holding sequence's id (mod 36), '*' if shared, '.' if free."""
        owners: dict[int, set[int]] = {}
        for seq in self.holders.values():
            for b in seq.block_table:
                owners.setdefault(b, set()).add(seq.seq_id)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"
        return "".join("." if b not in owners else "*" if len(owners[b]) > 1 else digits[min(owners[b]) % 36]
                       for b in range(self.num_blocks))

    def to_dot(self, name: str = "paged", row: int = 16) -> str:
        """Block tables (one record per sequence, on top) pointing at the pool's blocks (below, in id order,
        `row` per line) with their ref counts: green held once, yellow shared, grey free."""
        dot = Dot(name, rankdir="TB", nodesep="0.08", ranksep="0.6")
        bm = self.block_manager
        for seq in sorted(self.holders.values(), key=lambda s: s.seq_id):
            cells = "|".join(f"<b{i}> {b}" for i, b in enumerate(seq.block_table)) or "(none)"
            dot.raw(f'"seq{seq.seq_id}" [shape=record, style="filled", fillcolor="#e8f0fe", '
                    f'label="seq {seq.seq_id}\\n{seq.num_computed_tokens}/{seq.num_tokens} tok|{cells}"];')
            for i, b in enumerate(seq.block_table):
                dot.raw(f'"seq{seq.seq_id}":b{i} -> "blk{b}";')
        for b in range(self.num_blocks):
            ref = bm.ref_count[b]
            color = "#cccccc" if ref == 0 else ("#fde293" if ref > 1 else "#ceead6")
            dot.node(f"blk{b}", f"block {b}\nref {ref}", fillcolor=color)
        for start in range(0, self.num_blocks, row):  # the pool as rows of blocks, kept in id order
            ids = range(start, min(start + row, self.num_blocks))
            dot.raw("{ rank=same; " + " ".join(f'"blk{b}";' for b in ids) + " }")
            dot.raw(" -> ".join(f'"blk{b}"' for b in ids) + " [style=invis];")
            if start + row < self.num_blocks:
                dot.raw(f'"blk{start}" -> "blk{start + row}" [style=invis];')
        return dot.source()
