"""The kernels on an FP8 pool (fp8_pool.py's `FP8KVPool`), against the torch path: the store quantizes byte for byte
as `quantize` does (dynamic scales per token and head, static per head or per layer, saturation, slot -1), the
decode, extend and cascade kernels read the bytes and their scales to the torch path's dequantized attention, and the
engine on the kernels (the bridge, cascade decode) gives the torch path's fp8 tokens.

On a CPU the kernels run through Triton's interpreter, which reads float8_e4m3 exactly but rounds to it wrongly
(interpreter.py): `use_interpreter_without_gpu` (called by the root conftest) routes that conversion through
PyTorch's, and the first test checks it over every fp16 value against the format's definition. On a GPU the same
tests check the compiled conversion (`cvt.rn.satfinite`)."""
from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from benchmarks.step06.fp8 import pool_differences
from step01_kvcache.generate import SamplingParams
from step01_kvcache.tiny import tiny_model
from step06_triton.cascade import CascadeGroup, CascadeMetadata, cascade_decode_attention
from step06_triton.decode_attention import paged_decode_attention
from step06_triton.engine import make_engine
from step06_triton.extend_attention import extend_attention
from step06_triton.fp8_pool import FP8, FP8_MAX, dequantize, quantize, token_scales
from step06_triton.store_kvcache import store_kvcache
from tests.driver import drive_to_end, shared_prompts
from tests.step06.test_kernels import (
    DEVICE,
    SPLIT_ALL,
    Pool,
    assert_close,
    poisoned,
    reference_decode,
    reference_extend,
)


@triton.jit
def _to_fp8_kernel(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(tl.float8e4nv))


def nearest_e4m3(x: torch.Tensor) -> torch.Tensor:
    """The e4m3 bytes of `x` by the format's definition, no conversion routine involved: the nearest of the 127
    non-negative finite e4m3 values to |x| (ties to the even byte, its last mantissa bit 0), saturated at 448, with
    x's sign bit."""
    codes = torch.arange(127, dtype=torch.int64)  # 0x00 .. 0x7e: 0x7f is NaN
    values = codes.to(torch.uint8).view(FP8).double()  # decoding a byte is exact
    mag = x.double().abs().clamp(max=FP8_MAX)
    dist = (mag[:, None] - values[None, :]).abs()
    ties = dist == dist.min(1, keepdim=True).values
    best = torch.where(ties & (codes % 2 == 0), codes, torch.where(ties, codes + 1000, 10_000)).min(1).values % 1000
    return (best + 128 * torch.signbit(x).long()).to(torch.uint8)


def test_the_kernels_round_to_e4m3_as_the_format_defines():
    """Every finite fp16 value (and the same values in fp32): to nearest even, saturating at +-448. The reference is
    the definition (`nearest_e4m3`), not PyTorch's conversion, which the interpreter's workaround itself uses."""
    values = torch.arange(2**16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    values = values[torch.isfinite(values)]
    want = nearest_e4m3(values)
    assert torch.equal(want, values.float().clamp(-FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8)), "PyTorch agrees"
    for x in (values, values.float()):
        got = torch.empty(x.numel(), dtype=FP8, device=DEVICE)
        _to_fp8_kernel[(x.numel() // 1024,)](x.to(DEVICE), got, N=1024)
        assert torch.equal(got.cpu().view(torch.uint8), want), x.dtype


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's own conversion (compiled kernels do not use it)")
def test_the_stock_interpreter_rounds_to_e4m3_wrongly():
    """What interpreter.py works around, as the lesson states it. If this fails, Triton fixed its interpreter: drop
    `round_to_fp8_as_the_gpu_does` and the lesson's paragraph."""
    import numpy as np
    from triton.runtime import interpreter

    stock = interpreter._convert_float.stock
    x = np.array([7.9, 17.0, 464.0], dtype=np.float32)
    got = stock(x, tl.float32, tl.float8e4nv, interpreter._ir.ROUNDING_MODE.RTNE)
    got = torch.from_numpy(np.ascontiguousarray(got).view(np.uint8)).view(FP8).float().tolist()
    assert got[:2] == [4.0, 18.0] and math.isnan(got[2]), "7.9 -> 4 (no carry), 17 -> 18 (a tie rounded up), NaN"
    assert torch.tensor([7.9, 17.0, 464.0]).to(FP8).float().tolist() == [8.0, 16.0, 448.0], "what is right"


class FP8Pool(Pool):
    """Pool's random K/V stored as float8_e4m3fn with their scales: per token and head, or static (one per head,
    one for the layer). `k`, `v` hold the dequantized values, what the torch path attends over."""

    def __init__(self, *args, scales: str = "token", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        heads = self.k.shape[-2]
        self.k8, self.v8 = [], []
        for name in ("k", "v"):
            x = getattr(self, name) * 3
            s = {"token": token_scales(x), "head": torch.rand(heads) / 40 + 0.005,
                 "layer": torch.tensor([0.012])}[scales].to(DEVICE)
            stored = quantize(x, s)
            setattr(self, f"{name}8", stored)
            setattr(self, f"{name}_scale", s.contiguous())
            setattr(self, name, dequantize(stored, s, torch.float32))

    @property
    def scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_scale, self.v_scale


# ---- the store: quantize as the torch path does --------------------------------------------------------------
@pytest.mark.task("task6.quantize")
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 64), (3, 64), (2, 128)])
def test_fp8_store_quantizes_each_row_with_its_own_scale(block_size, num_kv_heads, head_dim):
    g = torch.Generator().manual_seed(block_size + head_dim)
    num_blocks, T = 8, 6
    k_cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=FP8, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    k_scale = torch.full((num_blocks, block_size, num_kv_heads), -1.0, device=DEVICE)  # -1: never written
    v_scale = k_scale.clone()
    k = (torch.randn(T, num_kv_heads, head_dim, generator=g) * torch.logspace(-2, 2, T)[:, None, None]).to(DEVICE)
    v = torch.randn(T, num_kv_heads, head_dim, generator=g).to(DEVICE)
    k[2] = 0  # a row of zeros: scale 1, bytes 0
    slots = torch.randperm(num_blocks * block_size, generator=g)[:T]
    slots[4] = -1  # a padding row: stored nowhere
    store_kvcache(k, v, k_cache, v_cache, slots.to(DEVICE), (k_scale, v_scale))
    keep = slots >= 0
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        flat, flat_scale = cache.view(-1, num_kv_heads, head_dim), scale.view(-1, num_kv_heads)
        want = token_scales(x[keep.to(DEVICE)])
        assert torch.equal(flat_scale[slots[keep]], want), "each head row's scale: its amax / 448"
        assert torch.equal(flat[slots[keep]].view(torch.uint8), quantize(x[keep.to(DEVICE)], want).view(torch.uint8))
        others = torch.ones(flat.shape[0], dtype=torch.bool)
        others[slots[keep]] = False
        assert (flat_scale[others.to(DEVICE)] == -1).all() and flat[others.to(DEVICE)].float().abs().sum() == 0, \
            "a slot that was not stored to changed (slot -1, or a row written twice)"


@pytest.mark.task("task6.quantize")
@pytest.mark.parametrize("per_head", [True, False])
def test_fp8_store_with_static_scales_saturates(per_head):
    """Static scales (calibrated, vLLM's k_scale / v_scale) are read, never written; what they cannot represent
    saturates at +-448 rather than overflowing to NaN."""
    heads, dim = 2, 16
    k_cache = torch.zeros(2, 4, heads, dim, dtype=FP8, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    k_scale = torch.tensor([0.01, 0.02] if per_head else [0.01], device=DEVICE)
    v_scale = k_scale * 3
    k = torch.randn(3, heads, dim, device=DEVICE)
    k[1, 0, :3] = torch.tensor([100.0, -7.0, 1e4])  # beyond 448 * 0.01
    v = torch.randn(3, heads, dim, device=DEVICE)
    store_kvcache(k, v, k_cache, v_cache, torch.tensor([5, 0, 2], device=DEVICE), (k_scale, v_scale))
    slots = torch.tensor([5, 0, 2], device=DEVICE)
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        stored = cache.view(-1, heads, dim)[slots]
        assert torch.equal(stored.view(torch.uint8), quantize(x, scale).view(torch.uint8))
    assert k_cache.view(-1, heads, dim)[0, 0, :3].float().tolist() == [FP8_MAX, -FP8_MAX, FP8_MAX]
    assert torch.equal(k_scale, torch.tensor([0.01, 0.02] if per_head else [0.01], device=DEVICE)), "scales are read"


def test_fp8_store_rejects_missing_or_misshapen_scales():
    cache = torch.zeros(2, 4, 2, 16, dtype=FP8, device=DEVICE)
    k = torch.zeros(1, 2, 16, device=DEVICE)
    slots = torch.zeros(1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="needs its kv_scales"):
        store_kvcache(k, k, cache, cache.clone(), slots)
    with pytest.raises(ValueError, match="fit neither"):
        bad = torch.ones(2, 4, 3, device=DEVICE)
        store_kvcache(k, k, cache, cache.clone(), slots, (bad, bad))
    with pytest.raises(ValueError, match="float8_e4m3fn pool"):
        store_kvcache(k, k, torch.zeros(2, 4, 2, 16, device=DEVICE), torch.zeros(2, 4, 2, 16, device=DEVICE), slots,
                      (torch.ones(2), torch.ones(2)))


# ---- decode, extend and cascade over the bytes and their scales ------------------------------------------------
# end to end: decode (with its merge) and extend over an FP8 pool
@pytest.mark.task("task6.address")
@pytest.mark.task("task6.online_softmax")
@pytest.mark.task("task6.causal")
@pytest.mark.task("task6.merge")
@pytest.mark.parametrize("scales", ["token", "head", "layer"])
@pytest.mark.parametrize("block_size,group", [(1, 3), (16, 4)])
def test_decode_and_extend_read_fp8_as_the_torch_path_dequantizes_it(scales, block_size, group):
    lengths, q_lens = [1, 16, 37], [1, 9, 20]
    pool = FP8Pool(lengths, block_size, num_kv_heads=2, head_dim=64, seed=group, scales=scales)
    q = torch.randn(len(lengths), 2 * group, 64, device=DEVICE)
    out = poisoned(q.shape, q.dtype)
    paged_decode_attention(q, pool.k8, pool.v8, pool.block_table, pool.seq_lens, 4, out=out, kv_scales=pool.scales,
                           **SPLIT_ALL)
    assert_close(out, reference_decode(pool, q), torch.float32)
    qx = torch.randn(sum(q_lens), 2 * group, 64, device=DEVICE)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    out = extend_attention(qx, pool.k8, pool.v8, pool.block_table, qsl, pool.seq_lens, max(q_lens), block_m=16,
                           block_n=16, kv_scales=pool.scales)
    assert_close(out, reference_extend(pool, qx, q_lens), torch.float32)


def test_fp16_queries_over_an_fp8_pool():
    """The e4m3 bytes convert exactly to q's dtype; the scales are applied in fp32."""
    pool = FP8Pool([9, 33], 16, num_kv_heads=2, head_dim=128, seed=3)
    q = torch.randn(2, 8, 128, device=DEVICE).half()
    out = paged_decode_attention(q, pool.k8, pool.v8, pool.block_table, pool.seq_lens, 2, kv_scales=pool.scales,
                                 **SPLIT_ALL)
    assert out.dtype == torch.float16
    assert_close(out, reference_decode(pool, q), torch.float16)


@pytest.mark.parametrize("amax", [3.0, 0.1, 0.01, 0.001])
def test_fp16_weights_keep_their_bits_when_v_is_small(amax):
    """The V scales weigh the softmax weights in fp16 (p_j s_j): with rows of small values (s_j = amax / 448) and a
    peaked softmax, most weights are tiny, and a weight under fp16's normal range (6e-5) would keep few bits. The
    kernel carries the weights scaled by a power of two, so that the output stays as close to the torch path's as
    the fp16 products allow, whatever the rows' size."""
    pool = FP8Pool([700, 1500], 16, num_kv_heads=1, head_dim=64, seed=5)
    g = torch.Generator().manual_seed(1)
    v = torch.randn(pool.v.shape, generator=g).to(DEVICE)
    v = v / v.abs().amax(-1, keepdim=True) * amax  # every head row's largest value is amax
    pool.v_scale = token_scales(v).contiguous()
    pool.v8 = quantize(v, pool.v_scale)
    pool.v = dequantize(pool.v8, pool.v_scale, torch.float32)
    q = (torch.randn(2, 4, 64, generator=g) * 4).to(DEVICE).half()  # peaked scores: most weights far below 1
    out = paged_decode_attention(q, pool.k8, pool.v8, pool.block_table, pool.seq_lens, 4, kv_scales=pool.scales,
                                 **SPLIT_ALL)
    ref = reference_decode(pool, q.float())
    err = float((out.double() - ref.double()).norm() / ref.double().norm())
    assert err < 1e-3, f"relative error {err:.1e} with rows of amax {amax}"


def test_cascade_reads_an_fp8_prefix_once_as_plain_decode_reads_it():
    lengths = [23, 30, 18]
    pool = FP8Pool(lengths, 4, num_kv_heads=1, head_dim=64, seed=2)
    shared = pool.tables[0][:3]  # rows 0-2 share their first 3 blocks (a 12-token prefix)
    for r in (1, 2):
        pool.tables[r][:3] = shared
        pool.block_table[r, :3] = torch.tensor(shared, dtype=torch.int32)
    q = torch.randn(3, 3, 64, device=DEVICE)
    md = CascadeMetadata.build([CascadeGroup((0, 1, 2), 12)], lengths, 3, 1, 64, DEVICE)
    out = cascade_decode_attention(q, pool.k8, pool.v8, pool.block_table, md, kv_scales=pool.scales, **SPLIT_ALL)
    assert_close(out, reference_decode(pool, q), torch.float32)


# ---- the engine on the kernels ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=7, num_heads=6, num_kv_heads=2).to(DEVICE)


def test_the_kernels_give_the_torch_paths_fp8_tokens(model):
    """On the bridge in blocks of 4: chunks, round 2's prefix hits and cascade decode over fp8 prefixes give the
    torch path's tokens (every design gives the same fp8 tokens on the torch path: tests/step06/test_fp8_designs.py)."""
    prompts, params = shared_prompts(3, seed=3, stem=40) + [[5]], SamplingParams(max_new_tokens=4)
    outs = {}
    for backend in ("torch", "triton"):
        options = dict(cascade=True, cascade_min_tokens=4, cascade_min_seqs=2) if backend == "triton" else {}
        engine = make_engine(model, "bridge", backend, num_blocks=60, block_size=4, max_num_seqs=3,
                             max_num_batched_tokens=24, kv_cache_dtype="fp8_e4m3", **options)
        outs[backend] = [[o.output_ids for o in drive_to_end(engine, prompts, params)] for _ in range(2)]
    assert outs["triton"] == outs["torch"]


def test_the_paths_store_the_same_bytes_but_where_rounding_meets_an_ulp():
    """Why fp32 token identity between the torch path and the kernels is fragile over an fp8 pool (the lesson's
    *Token identity on the GPU*): the first layer's K/V, computed by the same code in both, are stored byte for byte
    alike; a later layer's input carries the last-bit differences of two correct attention computations, so most of
    its rows get a scale a few ulps apart, and the e4m3 bytes still agree but for the rare value at a rounding
    midpoint, which lands one step apart."""
    model = tiny_model(seed=11, num_layers=4).to(DEVICE)
    prompt = torch.randint(3, 250, (64,), generator=torch.Generator().manual_seed(4)).tolist()
    pools = []
    for backend in ("torch", "triton"):
        engine = make_engine(model, "bridge", backend, num_blocks=8, block_size=16, max_num_seqs=1,
                             max_num_batched_tokens=64, kv_cache_dtype="fp8_e4m3")
        drive_to_end(engine, [prompt], SamplingParams(max_new_tokens=1))
        pools.append(engine.pool)
    rows = len(prompt) * model.config.num_kv_heads
    for diff in pool_differences(*pools):
        if diff["layer"] == 0:
            assert diff["bytes_differing"] == diff["scales_differing"] == 0
            continue
        assert diff["scales_differing"] > rows, "later layers' rows should carry last-bit differences into scales"
        assert diff["largest_scale_difference"] < 1e-5, "scales a few ulps apart at most"
        assert diff["bytes_differing"] <= 0.01 * 2 * rows * model.config.head_dim, "bytes apart only at midpoints"


def test_every_ablation_variant_patches_the_kernel_it_names(tmp_path):
    """measure/fp8_ablation.py changes `attend_tile`'s FP8 branch by text: each variant must still find what it
    replaces in the kernel (it raises otherwise) and leave Python that parses; only `kernel` is the kernel itself."""
    import ast

    from benchmarks.step06 import fp8_ablation
    kernel = (fp8_ablation.PACKAGE / "decode_attention.py").read_text()
    for variant in fp8_ablation.VARIANTS:
        source = (fp8_ablation.patched(variant, tmp_path / variant) / "step06_triton" / "decode_attention.py")
        text = source.read_text()
        ast.parse(text)
        assert (text == kernel) == (variant == "kernel"), variant
