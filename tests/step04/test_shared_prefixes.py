"""Which running requests share a prefix, read off the tree: the nodes their locked paths run through (the counts
`lock_ref` keeps). Groups are as large as they can be, so two system prompts in one batch make two groups; a
prefix common to the whole batch would find none. The same code serves chapter 5's bridge, in whole blocks."""
from __future__ import annotations

import pytest

from step01_kvcache.generate import SamplingParams
from step02_paged.geometry import PoolGeometry
from step02_paged.scheduler import admit as admit_after_match
from step04_radix import RadixKVCacheManager, RadixSequence
from step05_bridge import BridgeKVCacheManager

A, B = list(range(100, 112)), list(range(200, 210))  # two system prompts, 12 and 10 tokens


def running(kv, prompts: list[list[int]]) -> list[RadixSequence]:
    """Requests admitted one by one, each prefilled (its tokens join the tree) and left running."""
    seqs = []
    for i, tokens in enumerate(prompts):
        seq = RadixSequence(i, list(tokens), SamplingParams(max_new_tokens=4))
        match = kv.get_computed_blocks(seq)
        assert kv.allocate_slots(seq, seq.num_tokens - match.num_tokens, match)
        admit_after_match(kv, seq, match)
        seq.advance(seq.num_tokens - seq.num_computed_tokens)
        kv.on_computed(seq)
        seqs.append(seq)
    kv.check_invariants()
    return seqs


def groups(kv, seqs, min_blocks=1) -> list[tuple[tuple[int, ...], int]]:
    return [(tuple(s.seq_id for s in g.seqs), g.num_blocks) for g in kv.shared_prefixes(seqs, min_blocks)]


def test_two_system_prompts_make_two_groups():
    kv = RadixKVCacheManager(PoolGeometry(256, 1))
    seqs = running(kv, [A + [1, 2], B + [3], A + [4, 5, 6], B + [7, 8], A + [9]])
    assert groups(kv, seqs) == [((0, 2, 4), 12), ((1, 3), 10)]
    assert groups(kv, seqs, min_blocks=11) == [((0, 2, 4), 12)]
    assert groups(kv, seqs[:1]) == [] and groups(kv, [seqs[0], seqs[1]]) == [], "nothing shared, no group"


def test_a_group_too_short_gives_way_to_the_longer_groups_below_it():
    kv = RadixKVCacheManager(PoolGeometry(256, 1))
    seqs = running(kv, [A + [1, 2, 3, 4, 5], A + [1, 2, 3, 4, 6], A + [7]])
    assert groups(kv, seqs) == [((0, 1, 2), 12)], "all three share A"
    assert groups(kv, seqs, min_blocks=13) == [((0, 1), 16)], "only two share A and four tokens more"
    assert groups(kv, seqs, min_blocks=17) == []


def test_the_bridge_groups_in_whole_blocks():
    kv = BridgeKVCacheManager(PoolGeometry(64, 4))
    seqs = running(kv, [A + [1, 2], B + [3], A + [4, 5, 6], B + [7, 8]])
    assert groups(kv, seqs) == [((0, 2), 3), ((1, 3), 2)], "12 tokens fill three blocks, 10 tokens two"
    for group in kv.shared_prefixes(seqs):  # the blocks are the same at the head of every member's table
        assert len({tuple(s.block_table[: group.num_blocks]) for s in group.seqs}) == 1


@pytest.mark.parametrize("manager,block_size", [(RadixKVCacheManager, 1), (BridgeKVCacheManager, 4)])
def test_every_group_reads_the_same_blocks_and_no_one_is_in_two(manager, block_size):
    import random

    rng = random.Random(block_size)
    stems = [[rng.randrange(500) for _ in range(20)] for _ in range(3)]
    kv = manager(PoolGeometry(1024 // block_size, block_size))
    seqs = running(kv, [rng.choice(stems)[: rng.randint(2, 20)] + [rng.randrange(500, 600)] for _ in range(12)])
    seen = set()
    for group in kv.shared_prefixes(seqs):
        assert len(group.seqs) >= 2 and group.num_blocks >= 1
        assert len({tuple(s.block_table[: group.num_blocks]) for s in group.seqs}) == 1
        assert not seen & {s.seq_id for s in group.seqs}
        seen |= {s.seq_id for s in group.seqs}
