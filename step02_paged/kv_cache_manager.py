"""KVCacheManager: paging alone. Gives each sequence the blocks it needs, step by step, through the BlockManager.

It implements the cache-manager interface (cache_manager.py) with the simplest answers: a lookup finds
nothing, allocation grows a sequence's block table one block at a time as its tokens need them, and freeing
releases the table, its last block first. A match handed in (built by hand, say) is shared by taking one more
reference on each of its blocks: a block's ref_count is the number of block tables that list it.

The two helpers below, `table_slot_usage` and `check_block_tables`, state what holds for block tables over a
BlockManager whoever fills them; the invariants hold the managers' O(1) bookkeeping against them.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from step01_kvcache.request import SamplingParams

from .block_manager import BlockManager
from .cache_manager import CacheManager, PrefixMatch
from .geometry import PoolGeometry, cdiv
from .kv_pool import KVPool
from .sequence import Sequence


class KVCacheManager(CacheManager):
    """Block tables over a BlockManager; a sequence holds at most ceil(tokens / block_size) blocks."""

    design = "none"  # paging, no prefix cache

    def __init__(self, geometry: PoolGeometry, pool: KVPool | None = None) -> None:
        super().__init__(geometry, pool)
        self.block_manager = BlockManager(geometry.num_blocks)

    def new_sequence(self, seq_id: int, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        return Sequence(seq_id, prompt_ids, params)

    def get_computed_blocks(self, seq: Sequence) -> PrefixMatch:
        """Paging alone keeps nothing for later: no prefix is ever found."""
        return PrefixMatch()

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Grow `seq.block_table` to cover its computed tokens + `num_new_tokens`. On admission the match's
        blocks are shared first (one more holder each). All or nothing: False changes nothing."""
        need = self.blocks_needed(seq, num_new_tokens, match)
        if not need and seq.seq_id in self.holders:  # most decode steps: the last block still has room
            return True
        # BEGIN SOLUTION task2.allocate_slots points=3
        bm = self.block_manager
        if not bm.can_allocate(need):
            return False
        new = bm.allocate(need)  # first: if it raises, the sequence holds nothing new
        if seq.seq_id not in self.holders:  # admission: share the match's blocks, then the new ones
            shared = list(match.blocks) if match else []
            bm.retain(shared)
            seq.block_table = shared
            self.holders[seq.seq_id] = seq
        seq.block_table += new
        return True
        # END SOLUTION

    def on_computed(self, seq: Sequence) -> None:
        """Nothing to publish: paging alone shares nothing."""

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's hold on its blocks (finish, abort or preemption), tail first: the free list
        then hands out a request's last blocks before its first ones (vLLM frees in the same order)."""
        self.block_manager.release(seq.block_table[::-1])
        seq.block_table = []
        self.holders.pop(seq.seq_id, None)

    def num_held_blocks(self) -> int:
        return self.num_blocks - self.block_manager.num_free

    def check_invariants(self) -> None:
        """The BlockManager's invariants, and every block's ref_count = the block tables that list it."""
        self.block_manager.check_invariants()
        check_block_tables(list(self.holders.values()), self.block_manager, self.block_size)
        check_slot_usage(self)


def table_slot_usage(seqs: Iterable[Sequence], block_size: int) -> tuple[int, int]:
    """(allocated slots, filled slots) over the blocks these tables list, counted from scratch. A block shared by
    several sequences counts once, filled as far as its fullest holder wrote it."""
    fill: dict[int, int] = {}
    for seq in seqs:
        for i, b in enumerate(seq.block_table):
            written = min(block_size, max(0, seq.num_computed_tokens - i * block_size))
            fill[b] = max(fill.get(b, 0), written)
    return len(fill) * block_size, sum(fill.values())


def check_slot_usage(kv: CacheManager) -> None:
    """The manager's O(1) count of held blocks and the usage derived from it equal a count from scratch."""
    assert kv.slot_usage() == table_slot_usage(kv.holders.values(), kv.block_size), \
        f"slot usage {kv.slot_usage()} but the block tables say {table_slot_usage(kv.holders.values(), kv.block_size)}"


def check_block_tables(seqs: list[Sequence], block_manager: BlockManager, block_size: int,
                       other_holders: Counter | None = None) -> None:
    """Each live sequence holds no more blocks than its tokens need and computed tokens only inside them; every
    block's ref_count equals its holders: one per block table that lists it, plus `other_holders`."""
    expected = Counter(b for seq in seqs for b in seq.block_table) + (other_holders or Counter())
    for seq in seqs:
        assert not seq.is_finished, f"finished sequence {seq.seq_id} still holds blocks"
        assert len(seq.block_table) <= cdiv(seq.num_positions, block_size), \
            f"sequence {seq.seq_id} holds {len(seq.block_table)} blocks for {seq.num_positions} positions (tokens " \
            f"and drafts)"
        assert seq.num_computed_tokens <= len(seq.block_table) * block_size, \
            f"sequence {seq.seq_id}: computed tokens beyond its blocks"
    for b in range(block_manager.num_blocks):
        assert block_manager.ref_count[b] == expected.get(b, 0), \
            f"block {b}: ref_count {block_manager.ref_count[b]} but {expected.get(b, 0)} holders"
