"""The FP8 pool (`kv_cache_dtype="fp8_e4m3"`): what e4m3 keeps of a row, what a block costs, and an engine that runs
every design on it with the same tokens whichever way its K/V reached the pool (chunks, prefix hits, preemption,
the host tier). The fp32 path (`"auto"`) is chapter 2's pool, unchanged."""
from __future__ import annotations

import functools

import pytest
import torch

from course.tiny import tiny_config, tiny_model
from step01_kvcache.generate import SamplingParams
from step02_paged import Engine, EngineConfig, KVPool, PoolGeometry
from step02_paged.fp8_pool import FP8, FP8_MAX, FP8KVPool, KVScales, calibrate, dequantize, quantize, token_scales
from step05_bridge import BridgeKVCacheManager
from step06_triton.engine import make_engine
from tests.driver import drive_to_end, shared_prompts


def test_e4m3_keeps_every_row_within_one_sixteenth_and_its_largest_element_exactly():
    x = torch.randn(50, 3, 64) * torch.logspace(-3, 2, 50)[:, None, None]  # rows of very different sizes
    s = token_scales(x)
    back = dequantize(quantize(x, s), s, torch.float32)
    assert quantize(x, s).float().abs().amax(-1).eq(FP8_MAX).all(), "each row's largest element is stored as 448"
    assert torch.allclose(back.abs().amax(-1), x.abs().amax(-1), rtol=1e-6, atol=0), "... and read back exactly"
    normal = x.abs() >= s[..., None] * 2**-6  # below 2^-6 (after scaling) e4m3 has subnormals of fixed step 2^-9
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max() <= 1 / 16 + 1e-6, "3 mantissa bits: a normal value is rounded to within 1/16 of itself"
    assert ((back - x).abs()[~normal] <= s[..., None].expand_as(x)[~normal] * 2**-10 + 1e-12).all()


def test_a_row_of_zeros_and_saturation_of_a_static_scale():
    x = torch.zeros(2, 1, 16)
    x[1, 0, :4] = torch.tensor([1.0, -2.0, 900.0, -1e6])
    assert torch.equal(token_scales(x)[0], torch.ones(1)), "a row of zeros gets scale 1, not 0 (no 0/0)"
    q = quantize(x, torch.ones(1))  # a static scale of 1: 900 and -1e6 are beyond the format
    assert q.dtype == FP8 and q.float()[1, 0, :4].tolist() == [1.0, -2.0, FP8_MAX, -FP8_MAX]


def test_bytes_per_block_follow_the_dtype():
    cfg = tiny_config(num_layers=3, num_kv_heads=2, head_dim=64)
    geo = PoolGeometry(4, 16)
    fp32 = KVPool(cfg, geo)
    elements = 2 * 3 * 16 * 2 * 64  # K and V, layers, slots, heads, dim
    assert fp32.bytes_per_block == 4 * elements and KVPool(cfg, geo, torch.bfloat16).bytes_per_block == 2 * elements
    dynamic = FP8KVPool(cfg, geo)
    assert dynamic.bytes_per_block == elements + 4 * elements // 64, "one fp32 scale per 64 bytes of a head row"
    static = FP8KVPool(cfg, geo, scales=KVScales.uniform(3))
    assert static.bytes_per_block == elements and static.granularity == "tensor" and dynamic.granularity == "token"


@pytest.mark.parametrize("scales", [None, "tensor", "head"])
def test_store_then_gather_gives_the_dequantized_rows(scales):
    cfg = tiny_config(num_kv_heads=2)
    g = torch.Generator().manual_seed(1)
    static = {"tensor": KVScales(((0.01,), (0.02,)), ((0.03,), (0.04,))),
              "head": KVScales(((0.01, 0.02), (0.03, 0.04)), ((0.05, 0.06), (0.07, 0.08)))}.get(scales)
    pool = FP8KVPool(cfg, PoolGeometry(6, 4), scales=static)
    k, v = torch.randn(5, 2, 16, generator=g), torch.randn(5, 2, 16, generator=g)
    slots = torch.tensor([3, 17, 0, 9, 22])
    pool.store(1, slots, k, v)
    got_k, got_v = pool.gather(1, slots.view(1, 5))  # any shape of slots
    if static is None:
        want_k, want_v = (dequantize(quantize(t, token_scales(t)), token_scales(t), torch.float32) for t in (k, v))
    else:
        ks, vs = static.tensors()[0][1], static.tensors()[1][1]
        want_k, want_v = dequantize(quantize(k, ks), ks, torch.float32), dequantize(quantize(v, vs), vs, torch.float32)
    assert torch.equal(got_k[0], want_k) and torch.equal(got_v[0], want_v)
    assert pool.k.dtype == FP8 and pool.k[0].float().abs().sum() == 0, "another layer was written"


def test_config_checks_the_dtype_and_the_scales_once():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="fp8_e4m3"):
        EngineConfig(kv_scales=KVScales.uniform(2))  # static scales for an fp32 pool
    with pytest.raises(ValueError, match="finite positive"):
        KVScales(((1.0,), (0.0,)), ((1.0,), (1.0,)))
    with pytest.raises(ValueError, match="layers"):
        Engine(tiny_model(), EngineConfig(kv_cache_dtype="fp8_e4m3", kv_scales=KVScales.uniform(5)))


def test_auto_is_chapter_2s_pool_byte_for_byte():
    engine = Engine(tiny_model(), EngineConfig(num_blocks=8))
    assert type(engine.pool) is KVPool and engine.pool.k.dtype == torch.float32
    assert engine.kv_bytes_per_block == engine.model.config.kv_bytes_per_token(4) * 16


def test_calibrated_scales_map_the_largest_value_seen_to_448(tiny):
    prompts = [[1, 2, 3, 4, 5], list(range(40, 90))]
    per_head = calibrate(tiny, prompts)
    per_layer = per_head.per_layer()
    assert per_layer.granularity == "tensor" and per_head.granularity == "head"
    pk, hk = per_layer.tensors()[0], per_head.tensors()[0]
    assert torch.allclose(pk[:, 0], hk.amax(1)), "the layer's scale is its heads' largest"
    engine = Engine(tiny, EngineConfig(num_blocks=8, kv_cache_dtype="fp8_e4m3", kv_scales=per_head))
    assert engine.pool.granularity == "head" and engine.pool.bytes_per_block == engine.pool.k[:, 0].nbytes * 2
    assert all(len(o.output_ids) == 4 for o in drive_to_end(engine, prompts, SamplingParams(4)))


# ---- an engine on the FP8 pool --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=7, num_heads=6, num_kv_heads=2)


@pytest.fixture(scope="module")
def fp8_reference(model):
    """The plainest fp8 engine (paging only, whole prompts, room for all): what every other way must give."""
    prompts, params = shared_prompts(5, seed=3, stem=40) + [[5]], SamplingParams(max_new_tokens=6)
    engine = Engine(model, EngineConfig(num_blocks=128, block_size=16, max_num_batched_tokens=512,
                                        kv_cache_dtype="fp8_e4m3"))
    return prompts, params, [o.output_ids for o in drive_to_end(engine, prompts, params)]


BLOCK = {"none": 4, "hash": 4, "radix": 1, "bridge": 4}


@pytest.mark.parametrize("design", ["none", "hash", "radix", "bridge"])
def test_every_design_gives_the_same_tokens_on_fp8_through_chunks_hits_and_preemption(model, fp8_reference, design):
    """A prefix hit reads the bytes an earlier request quantized; a recomputed prefix quantizes the same values
    again: per-token scales make both the same bytes, so the tokens cannot change (chunked prefill, round 2's
    hits and a pool small enough to preempt)."""
    prompts, params, expected = fp8_reference
    engine = make_engine(model, design, "torch", num_blocks=64 // BLOCK[design], block_size=BLOCK[design],
                         max_num_seqs=3, max_num_batched_tokens=16, kv_cache_dtype="fp8_e4m3")
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
    engine = Engine(model, EngineConfig(num_blocks=14, block_size=4, max_num_seqs=1, kv_cache_dtype="fp8_e4m3"),
                    manager)
    for _ in range(2):
        outs = [drive_to_end(engine, [p], params)[0] for p in prompts]
        assert [o.output_ids for o in outs] == expected
    host = engine.cache_manager.host
    assert host.k.dtype == FP8 and host.bytes_per_block == engine.kv_bytes_per_block
    assert host.blocks_loaded > 0, "round 2 was meant to load prefixes back from host memory"
