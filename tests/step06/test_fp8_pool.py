"""The FP8 pool (`kv_pool("fp8_e4m3")`, `make_engine(kv_cache_dtype="fp8_e4m3")`): what e4m3 keeps of a row, what
a block costs, its scales, and chapter 2's engine on it through its pool seam (every design of chapters 3-5 on it:
tests/step06/test_fp8_designs.py). The fp32 path (`"auto"`) is chapter 2's pool, unchanged."""
from __future__ import annotations

import pytest
import torch

from step01_kvcache.generate import SamplingParams
from step01_kvcache.tiny import tiny_config, tiny_model
from step02_paged import Engine, EngineConfig, KVPool, PoolGeometry
from step06_triton.engine import make_engine
from step06_triton.fp8_pool import (
    FP8,
    FP8_MAX,
    FP8KVPool,
    KVScales,
    calibrate,
    dequantize,
    kv_pool,
    quantize,
    token_scales,
)
from tests.driver import drive_to_end


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


def test_the_pool_checks_the_dtype_and_the_scales_once():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_pool("fp8")
    with pytest.raises(ValueError, match="fp8_e4m3"):
        kv_pool(kv_scales=KVScales.uniform(2))  # static scales for an fp32 pool
    with pytest.raises(ValueError, match="finite positive"):
        KVScales(((1.0,), (0.0,)), ((1.0,), (1.0,)))
    with pytest.raises(ValueError, match="layers"):
        Engine(tiny_model(), EngineConfig(), pool=kv_pool("fp8_e4m3", KVScales.uniform(5)))
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        make_engine(tiny_model(), "bridge", "torch", kv_cache_dtype="fp16")


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
    engine = Engine(tiny, EngineConfig(num_blocks=8), pool=kv_pool("fp8_e4m3", per_head))
    assert engine.pool.granularity == "head" and engine.pool.bytes_per_block == engine.pool.k[:, 0].nbytes * 2
    assert all(len(o.output_ids) == 4 for o in drive_to_end(engine, prompts, SamplingParams(4)))
