"""Every design of chapters 2-5 on the FP8 pool (`pool=FP8KVPool`) gives the same tokens
whichever way its K/V reached the pool: chunks, prefix hits, preemption, and the host tier, whose blocks carry
their scales."""
from __future__ import annotations

import functools

import pytest

from step01_kvcache.generate import SamplingParams
from step01_kvcache.tiny import tiny_model
from step02_paged import Engine, EngineConfig, KVCacheManager
from step03_prefix_hash import PrefixCachingKVCacheManager
from step04_radix import RadixKVCacheManager
from step05_bridge import BridgeKVCacheManager
from step06_triton.fp8_pool import FP8, FP8KVPool
from tests.driver import drive_to_end, shared_prompts


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=7, num_heads=6, num_kv_heads=2)


@pytest.fixture(scope="module")
def fp8_reference(model):
    """The plainest fp8 engine (paging only, whole prompts, room for all): what every other way must give."""
    prompts, params = shared_prompts(5, seed=3, stem=40) + [[5]], SamplingParams(max_new_tokens=6)
    engine = Engine(model, EngineConfig(num_blocks=128, block_size=16, max_num_batched_tokens=512), pool=FP8KVPool)
    return prompts, params, [o.output_ids for o in drive_to_end(engine, prompts, params)]


MANAGERS = {"none": KVCacheManager, "hash": PrefixCachingKVCacheManager, "radix": RadixKVCacheManager,
            "bridge": BridgeKVCacheManager}
BLOCK = {"none": 4, "hash": 4, "radix": 1, "bridge": 4}  # the radix tree holds one token per slot


@pytest.mark.parametrize("design", ["none", "hash", "radix", "bridge"])
def test_every_design_gives_the_same_tokens_on_fp8_through_chunks_hits_and_preemption(model, fp8_reference, design):
    """A prefix hit reads the bytes an earlier request quantized; a recomputed prefix quantizes the same values
    again: per-token scales make both the same bytes, so the tokens cannot change (chunked prefill, round 2's
    hits and a pool small enough to preempt)."""
    prompts, params, expected = fp8_reference
    cfg = EngineConfig(num_blocks=64 // BLOCK[design], block_size=BLOCK[design], max_num_seqs=3,
                       max_num_batched_tokens=16)
    engine = Engine(model, cfg, MANAGERS[design], pool=FP8KVPool)
    assert engine.pool.k.dtype == FP8
    rounds = [drive_to_end(engine, prompts, params) for _ in range(2)]
    assert [[o.output_ids for o in outs] for outs in rounds] == [expected, expected]
    hits, preempted = (sum(getattr(o, name) for o in rounds[1]) for name in ("num_cached_tokens", "num_preemptions"))
    assert hits > 0 or design == "none", "round 2 was meant to hit the prefix cache"
    assert preempted > 0 or design == "radix", "the pool was meant to preempt"


def test_the_host_tier_moves_fp8_blocks_with_their_scales(model, fp8_reference):
    """Blocks evicted to host memory and loaded back carry their scales: without them a loaded block would be read
    with whatever scales its device block held before."""
    prompts, params, expected = fp8_reference
    manager = functools.partial(BridgeKVCacheManager, host_blocks=64, min_load_tokens=4)
    engine = Engine(model, EngineConfig(num_blocks=14, block_size=4, max_num_seqs=1), manager, pool=FP8KVPool)
    for _ in range(2):
        outs = [drive_to_end(engine, [p], params)[0] for p in prompts]
        assert [o.output_ids for o in outs] == expected
    host = engine.cache_manager.host
    assert host.k.dtype == FP8 and host.bytes_per_block == engine.kv_bytes_per_block
    assert host.blocks_loaded > 0, "round 2 was meant to load prefixes back from host memory"
