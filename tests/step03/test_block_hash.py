"""The chained block hash: deterministic, sensitive to everything that changes a block's K/V, incremental."""
from __future__ import annotations

import pytest

from step01_kvcache.request import SamplingParams
from step02_paged.geometry import PoolGeometry
from step03_prefix_hash import PrefixCachingKVCacheManager
from step03_prefix_hash.block_hash import NONE_HASH, hash_block_tokens, hash_token_blocks

from .helpers import hseq

SALT = (("salt", "tenant-a"),)


@pytest.mark.task("task3.block_hash")
def test_hash_is_deterministic_and_covers_tokens_order_and_count():
    a = hash_block_tokens(None, [1, 2, 3, 4])
    assert isinstance(a, bytes) and len(a) == 32
    assert a == hash_block_tokens(None, (1, 2, 3, 4)), "a list and a tuple of the same ids must hash alike"
    assert a != hash_block_tokens(None, [1, 2, 3, 5])
    assert a != hash_block_tokens(None, [2, 1, 3, 4])
    assert a != hash_block_tokens(None, [1, 2, 3, 4, 0])
    assert hash_block_tokens(None, [0]) != hash_block_tokens(None, [0, 0])


@pytest.mark.task("task3.block_hash")
def test_first_block_is_chained_to_the_fixed_seed():
    tokens = [7, 7, 7, 7]
    assert hash_block_tokens(None, tokens) == hash_block_tokens(NONE_HASH, tokens)


@pytest.mark.task("task3.block_hash")
def test_identical_tokens_with_a_different_parent_hash_differently():
    p1, p2 = hash_block_tokens(None, [1, 1, 1, 1]), hash_block_tokens(None, [2, 2, 2, 2])
    assert hash_block_tokens(p1, [5, 6, 7, 8]) != hash_block_tokens(p2, [5, 6, 7, 8])
    # the same second block behind two different first blocks: two different chains
    a = hash_token_blocks([1, 1, 1, 1, 5, 6, 7, 8], 4)
    b = hash_token_blocks([2, 2, 2, 2, 5, 6, 7, 8], 4)
    assert a[1] != b[1]


@pytest.mark.task("task3.block_hash")
def test_identical_tokens_with_a_different_salt_hash_differently():
    tokens = [1, 2, 3, 4]
    plain, salted = hash_block_tokens(None, tokens), hash_block_tokens(None, tokens, SALT)
    assert plain != salted
    assert salted == hash_block_tokens(None, tokens, SALT)
    assert salted != hash_block_tokens(None, tokens, (("salt", "tenant-b"),))
    # the salt sits on the first block only, and the chain carries it to every later block
    a = hash_token_blocks(list(range(12)), 4, cache_salt="tenant-a")
    b = hash_token_blocks(list(range(12)), 4, cache_salt="tenant-b")
    assert all(x != y for x, y in zip(a, b))


@pytest.mark.task("task3.block_hash")
def test_sequence_hashes_full_prompt_blocks_only():
    s = hseq(0, list(range(10)), block_size=4)
    assert len(s.block_hashes) == 2, "10 tokens = 2 full blocks + a partial one, which has no hash"
    assert s.block_hashes == hash_token_blocks(list(range(10)), 4)
    assert hseq(1, [3], block_size=4).block_hashes == []


@pytest.mark.task("task3.block_hash")
def test_sequence_hashes_blocks_filled_during_decode():
    s = hseq(0, list(range(6)), block_size=4)
    first = list(s.block_hashes)
    for t in (100, 101):
        s.append_token(t)
    assert len(s.block_hashes) == 2 and s.block_hashes[0] == first[0], "earlier hashes never change"
    assert s.block_hashes == hash_token_blocks(list(range(6)) + [100, 101], 4)
    for t in range(102, 107):
        s.append_token(t)
    assert len(s.block_hashes) == 3
    s.check_invariants()


@pytest.mark.task("task3.block_hash")
def test_sequence_salt_changes_every_block():
    a, b = hseq(0, list(range(8)), salt="x"), hseq(1, list(range(8)), salt="y")
    assert all(x != y for x, y in zip(a.block_hashes, b.block_hashes))
    assert a.block_hashes == hseq(2, list(range(8)), salt="x").block_hashes


def test_hash_is_stable_across_processes_and_versions():
    """A golden value: hashes that changed with the process (Python's str hash) or the platform's byte order
    would make a cache shared between processes miss, or worse, hit the wrong block."""
    assert hash_block_tokens(None, [1, 2, 3]).hex()[:16] == "72cee17d44c6c697"


def test_bad_block_size_is_refused_where_the_pool_is_cut():
    """Sequences take the block size of the manager that makes them, which takes the pool's checked geometry."""
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        PrefixCachingKVCacheManager(PoolGeometry(4, 0))
    kv = PrefixCachingKVCacheManager(PoolGeometry(4, 2))
    assert kv.new_sequence(0, [1, 2, 3], SamplingParams()).block_size == 2
