"""KVCacheManager: paging alone. Gives each sequence the blocks it needs, step by step, through the BlockManager.

It implements the cache-manager interface (cache_manager.py) with the simplest answers: a lookup finds
nothing, allocation grows a sequence's block table one block at a time as its tokens need them, and freeing
releases the table. A match handed in (built by hand, say) is shared by taking one more reference on each of
its blocks: a block's ref_count is the number of block tables that list it.

The two helpers below, `table_slot_usage` and `check_block_tables`, state what holds for block tables over a
BlockManager whoever fills them.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from step01_kvcache.generate import SamplingParams

from .block_manager import BlockManager
from .cache_manager import CacheManager, PrefixMatch, cdiv
from .sequence import Sequence


class KVCacheManager(CacheManager):
    """Block tables over a BlockManager; a sequence holds at most ceil(tokens / block_size) blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.block_manager = BlockManager(num_blocks)
        self.holders: dict[int, Sequence] = {}

    def new_sequence(self, seq_id: int, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        return Sequence(seq_id, prompt_ids, params)

    def get_computed_blocks(self, seq: Sequence) -> PrefixMatch:
        """Paging alone keeps nothing for later: no prefix is ever found."""
        return PrefixMatch()

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Grow `seq.block_table` to cover its computed tokens + `num_new_tokens`. On admission the match's
        blocks are shared first (one more holder each). All or nothing: False changes nothing."""
        # BEGIN SOLUTION task2.allocate_slots points=3
        shared = list(match.blocks) if match else []
        computed = match.num_tokens if shared else seq.num_computed_tokens
        need = max(0, cdiv(computed + num_new_tokens, self.block_size) - len(seq.block_table) - len(shared))
        if not self.block_manager.can_allocate(need):
            return False
        if shared:
            self.block_manager.retain(shared)
            seq.block_table = shared
            seq.num_computed_tokens = computed
            seq.record_prompt_hit(match.num_tokens)
        seq.block_table += self.block_manager.allocate(need)
        self.holders[seq.seq_id] = seq
        return True
        # END SOLUTION

    def on_computed(self, seq: Sequence) -> None:
        """Nothing to publish: paging alone shares nothing."""

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's hold on its blocks (finish, abort or preemption)."""
        self.block_manager.release(seq.block_table)
        seq.block_table = []
        self.holders.pop(seq.seq_id, None)

    def slot_usage(self) -> tuple[int, int]:
        return table_slot_usage(self.holders.values(), self.block_size)

    def check_invariants(self) -> None:
        """The BlockManager's invariants, and every block's ref_count = the block tables that list it."""
        self.block_manager.check_invariants()
        check_block_tables(list(self.holders.values()), self.block_manager, self.block_size)


def table_slot_usage(seqs: Iterable[Sequence], block_size: int) -> tuple[int, int]:
    """(allocated slots, filled slots) over the blocks these tables list. A block shared by several sequences
    counts once, filled as far as its fullest holder wrote it."""
    fill: dict[int, int] = {}
    for seq in seqs:
        for i, b in enumerate(seq.block_table):
            written = min(block_size, max(0, seq.num_computed_tokens - i * block_size))
            fill[b] = max(fill.get(b, 0), written)
    return len(fill) * block_size, sum(fill.values())


def check_block_tables(seqs: list[Sequence], block_manager: BlockManager, block_size: int,
                       other_holders: Counter | None = None) -> None:
    """Each live sequence holds no more blocks than its tokens need and computed tokens only inside them; every
    block's ref_count equals its holders: one per block table that lists it, plus `other_holders`."""
    expected = Counter(b for seq in seqs for b in seq.block_table) + (other_holders or Counter())
    for seq in seqs:
        assert not seq.is_finished, f"finished sequence {seq.seq_id} still holds blocks"
        assert len(seq.block_table) <= cdiv(seq.num_tokens, block_size), \
            f"sequence {seq.seq_id} holds {len(seq.block_table)} blocks for {seq.num_tokens} tokens"
        assert seq.num_computed_tokens <= len(seq.block_table) * block_size, \
            f"sequence {seq.seq_id}: computed tokens beyond its blocks"
    for b in range(block_manager.num_blocks):
        assert block_manager.ref_count[b] == expected.get(b, 0), \
            f"block {b}: ref_count {block_manager.ref_count[b]} but {expected.get(b, 0)} holders"
