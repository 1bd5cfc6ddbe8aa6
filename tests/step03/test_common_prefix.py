"""What every running request shares, from the reference counts the cache keeps anyway (vLLM's
`get_num_common_prefix_blocks`, which decides its cascade attention): a block whose ref_count equals the number of
requests holding blocks is in every block table, at the same place. The count is graded alone: the requests are
admitted and computed by the stand-ins of the chapter's other bodies (stand_in.py)."""
from __future__ import annotations

import random

import pytest

from step02_paged.geometry import PoolGeometry
from step03_prefix_hash import PrefixCachingKVCacheManager

from .helpers import hseq, prefilled

BS = 4


def common_by_comparison(tables: list[list[int]]) -> int:
    """The same count the slow way: leading positions where every table lists the same block."""
    n = 0
    while all(len(t) > n for t in tables) and len({t[n] for t in tables}) == 1:
        n += 1
    return n


@pytest.mark.task("task3.common_prefix")
@pytest.mark.usefixtures("alone")
def test_requests_behind_one_system_prompt_share_its_full_blocks():
    kv = PrefixCachingKVCacheManager(PoolGeometry(32, BS))
    system = list(range(10))  # two full blocks and half of a third
    seqs = [prefilled(kv, i, system + [100 + i, 200 + i]) for i in range(3)]
    assert kv.num_common_prefix_blocks(seqs[1]) == 2, "the half block is each request's own"
    [group] = kv.shared_prefixes(seqs)
    assert group.num_blocks == 2 and group.seqs == tuple(seqs)
    assert kv.shared_prefixes(seqs, min_blocks=3) == []
    other = prefilled(kv, 3, [7] * 9)  # a request with another prompt holds blocks too: nothing is common to all
    assert kv.num_common_prefix_blocks(seqs[0]) == 0 and kv.shared_prefixes(seqs + [other]) == []
    kv.free(other)
    assert kv.num_common_prefix_blocks(seqs[2]) == 2
    kv.check_invariants()


@pytest.mark.task("task3.common_prefix")
@pytest.mark.usefixtures("alone")
@pytest.mark.parametrize("seed", range(6))
def test_the_count_from_ref_counts_is_the_count_from_the_tables(seed):
    rng = random.Random(seed)
    kv = PrefixCachingKVCacheManager(PoolGeometry(64, BS))
    stem = [rng.randrange(50) for _ in range(20)]
    seqs = [prefilled(kv, i, stem[: rng.randint(4, 20)] + [rng.randrange(50, 99)]) for i in range(rng.randint(2, 5))]
    for s in seqs:
        assert kv.num_common_prefix_blocks(s) == common_by_comparison([t.block_table for t in seqs])


def test_one_request_shares_nothing():
    kv = PrefixCachingKVCacheManager(PoolGeometry(8, BS))
    seq = prefilled(kv, 0, list(range(9)))
    assert kv.shared_prefixes([seq]) == [] and kv.shared_prefixes([hseq(1, [1, 2])]) == []
