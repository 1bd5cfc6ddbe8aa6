"""KVCacheManager.allocate_slots and CacheManager.blocks_needed, graded alone: the manager runs over a stand-in
for the BlockManager written here (reference counts, a free list kept in order, no checks), so that
task2.allocate_slots needs no task2.allocate_free. Sequences are built by hand and moved as the scheduler and
the engine move them (`admit`, `advance`), without a model."""
from __future__ import annotations

import pytest

from step01_kvcache.request import SamplingParams
from step02_paged import KVCacheManager, PrefixMatch
from step02_paged.block_manager import BlockManager
from step02_paged.geometry import PoolGeometry


class StandInBlocks(BlockManager):
    """The BlockManager's contract in its plainest form: `allocate` hands out the first free blocks, `release`
    counts holders down and puts the blocks that nobody holds at the end of the free list, in the order given.
    It checks nothing: these tests never ask for more than is free."""

    def allocate(self, n: int) -> list[int]:
        taken = list(self.free_blocks)[:n]
        assert len(taken) == n, f"asked for {n} blocks with {self.num_free} free: ask can_allocate first"
        self.free_blocks = type(self.free_blocks)(list(self.free_blocks)[n:])
        self.ref_count[:] = [c + (b in taken) for b, c in enumerate(self.ref_count)]
        return taken

    def release(self, blocks) -> list[int]:
        for b in blocks:
            self.ref_count[b] -= 1
        gone = [b for b in dict.fromkeys(blocks) if self.ref_count[b] == 0]
        self.free_blocks.extend(gone)
        return gone


def manager(num_blocks: int, block_size: int) -> KVCacheManager:
    kv = KVCacheManager(PoolGeometry(num_blocks, block_size))
    kv.block_manager = StandInBlocks(num_blocks)
    return kv


def state(kv: KVCacheManager, *seqs) -> tuple:
    bm = kv.block_manager
    return (list(bm.ref_count), list(bm.free_blocks), sorted(kv.holders),
            [(list(s.block_table), s.num_computed_tokens) for s in seqs])


@pytest.mark.task("task2.allocate_slots")
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_blocks_grow_one_at_a_time(block_size):
    """A 5-token prompt, then decode steps: after each allocation the table holds ceil(tokens / block_size)
    blocks, and the manager never moves `num_computed_tokens`."""
    kv = manager(32, block_size)
    seq = kv.new_sequence(0, [5] * 5, SamplingParams(max_new_tokens=20))
    new = 5
    assert kv.allocate_slots(seq, new, PrefixMatch())
    seq.admit(0)
    for _ in range(8):
        assert len(seq.block_table) == -(-(seq.num_computed_tokens + new) // block_size)
        assert len(set(seq.block_table)) == len(seq.block_table), "a block listed twice"
        seq.advance(new)
        seq.append_token(1)
        kv.check_invariants()
        new = 1
        assert kv.allocate_slots(seq, new)
        assert seq.num_computed_tokens == seq.num_tokens - 1, "the manager never moves num_computed_tokens"
    assert kv.holders == {0: seq}


@pytest.mark.task("task2.allocate_slots")
def test_admission_shares_the_match_then_appends_new_blocks():
    """A second sequence admitted with a match of the first one's two full blocks: its table starts with them (one
    more holder each), the rest are fresh blocks; `blocks_needed` counts the match's tokens as computed."""
    kv = manager(10, 4)
    first = kv.new_sequence(0, list(range(10)), SamplingParams())
    assert kv.allocate_slots(first, 10, PrefixMatch())
    first.admit(0)
    first.advance(10)
    second = kv.new_sequence(1, list(range(8)) + [50, 51, 52, 53, 54], SamplingParams())
    match = PrefixMatch(tuple(first.block_table[:2]), 8)
    assert kv.blocks_needed(second, 5, match) == 2  # 13 tokens: 4 blocks, 2 of them shared
    assert kv.allocate_slots(second, 5, match)
    assert second.block_table[:2] == first.block_table[:2] and len(second.block_table) == 4
    assert not set(second.block_table[2:]) & set(first.block_table)
    assert [kv.block_manager.ref_count[b] for b in second.block_table] == [2, 2, 1, 1]
    assert second.num_computed_tokens == 0, "the scheduler starts the sequence after the match, not the manager"
    second.admit(8)
    second.advance(5)
    kv.check_invariants()
    assert kv.blocks_needed(second, 3) == 0  # held now: 13 + 3 tokens fit its 4 blocks
    assert kv.blocks_needed(second, 4) == 1


@pytest.mark.task("task2.allocate_slots")
def test_a_failed_allocation_changes_nothing():
    """All or nothing: a sequence asking for more blocks than are free gets False and nothing moves, on admission
    (with a match to share) and while running."""
    kv = manager(5, 4)
    first = kv.new_sequence(0, list(range(12)), SamplingParams())
    assert kv.allocate_slots(first, 12, PrefixMatch())
    first.admit(0)
    first.advance(12)
    second = kv.new_sequence(1, list(range(4)) + [9] * 12, SamplingParams())
    before = state(kv, first, second)
    assert not kv.allocate_slots(second, 12, PrefixMatch(tuple(first.block_table[:1]), 4))  # 3 new, 2 free
    assert state(kv, first, second) == before
    assert not kv.allocate_slots(first, 9)  # 21 tokens: 3 blocks more, 2 free
    assert state(kv, first, second) == before
    kv.check_invariants()
    kv.free(first)
    assert kv.allocate_slots(second, 16, PrefixMatch())  # 4 blocks of the 5, now free
    assert kv.block_manager.num_free == 1 and sorted(kv.holders) == [1]


@pytest.mark.task("task2.allocate_slots")
@pytest.mark.task("task2.allocate_free")
def test_free_releases_a_table_tail_first():
    """As vLLM's KVCacheManager frees: a request's last block goes back to the free list first, so the free list
    hands out its end before its start (the start is what other requests are likelier to share)."""
    kv = KVCacheManager(PoolGeometry(3, 4))
    seq = kv.new_sequence(0, list(range(12)), SamplingParams())
    assert kv.allocate_slots(seq, 12, PrefixMatch())
    table = list(seq.block_table)
    kv.free(seq)
    assert list(kv.block_manager.free_blocks) == table[::-1]
    kv.check_invariants()
