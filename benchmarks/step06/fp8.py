"""`python -m benchmarks.step06.fp8 [--out FILE] [--parts ...] [--quick] [--ncu]`: an FP8 KV cache on a GPU,
against the bf16 pool it replaces, each part checked against a reference before it is timed.

- `identity`: fp32, SmolLM2's shape, random weights, an fp8 pool (scales per token and head): the greedy tokens of
  the engine on the kernels (eager; CUDA graphs, fused, overlapped; cascade) against the torch path's, request by
  request, one part per engine (the report says which requests are identical and where the others first differ);
- `pool_bytes` (not in the default run): the torch path's fp8 pool against the kernels' after one 1,540-token
  prefill, fp32, SmolLM2's shape: per layer, the e4m3 bytes and the scales that differ (why `identity` can differ);
- `decode`: the ragged batch of measure/kernels.py (64 contexts drawn from 1..8192, blocks of 16 scattered over a
  pool twice the size needed), 32 query / 8 KV heads x 128 (a Llama-3-8B layer) and 9 / 3 x 64 (SmolLM2), bf16
  queries; the same K/V in a bf16 pool, in an fp8 pool with a scale per token and head (the course's) and with one
  static scale per layer: tokens of context read per second, bytes read per second (K/V with their scales, q, the
  output) and a device copy of the same bytes; a few decode tiles for the fp8 pool;
- `extend`: prefill after a cached prefix over a bf16 and an fp8 pool (4 x (4,096 cached + 2,048 new), and the
  ragged prefill of measure/kernels.py), TFLOP/s over the visible query-key pairs; the store kernel, GB/s;
- `capacity`: one KV byte budget for a bf16 and an fp8 pool, SmolLM2's shape, random weights, bf16: 64 requests of
  256..1,024 prompt tokens and 256 new tokens all at once through the course's GPU engine (chapter 5's bridge, CUDA
  graphs, fused, overlapped); the budget is 65% of what the bf16 pool needs to hold every request at once, so bf16
  preempts and fp8 (1.88x the blocks) does not. Preemptions, tokens/s, p50 / p99 request latency and time to first
  token, three interleaved rounds, each contender's median round.
Writes the JSON after every part (a part that fails is reported in it and the others still run).
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch

from benchmarks.runner import p99
from step01_kvcache.request import SamplingParams
from step01_kvcache.tiny import SMOLLM2_135M
from step02_paged.geometry import PoolGeometry, cdiv
from step06_triton.decode_attention import num_kv_splits, paged_decode_attention
from step06_triton.engine import make_engine
from step06_triton.extend_attention import extend_attention
from step06_triton.fp8_pool import FP8, dequantize, make_kv_pool, quantize, token_scales
from step06_triton.store_kvcache import store_kvcache

from .common import Parts, checked, copy_bandwidth, exact_fp32, median_ms, needs_gpu, random_model
from .engine import workload
from .fp8_report import IDENTITY_ENGINES, goals
from .kernels import (
    HEADS,
    LLAMA,
    PREFILL_SHAPE,
    check_prefill,
    decode_reference,
    extend_inputs,
    kv_bytes,
    ragged_decode_batch,
    ragged_prefill_shape,
)

DEVICE = "cuda"
BLOCK = 16
CAPACITY = dict(requests=64, prompt=(256, 1024), new_tokens=256, budget_of_bf16_need=0.65, seed=5)
FP8_TILES = ((64, 4), (128, 2), (128, 4), (128, 8), (256, 4), (256, 8))  # decode (BLOCK_N, num_warps) tried on fp8


def fp8_pools(k: torch.Tensor, v: torch.Tensor) -> dict[str, tuple]:
    """The same K/V as the three pools a kernel can read: (k, v, kv_scales, the values the kernel should see)."""
    out = {"bf16": (k, v, None, k.float(), v.float())}
    for name, scale in (("fp8_token", token_scales), ("fp8_static", lambda x: x.float().abs().amax().view(1) / 448)):
        ks, vs = scale(k).contiguous(), scale(v).contiguous()
        k8, v8 = quantize(k, ks), quantize(v, vs)
        out[name] = (k8, v8, (ks, vs), dequantize(k8, ks, torch.float32), dequantize(v8, vs, torch.float32))
    return out


def decode_rows(heads: str) -> dict:
    """Ragged decode over the bf16 and the fp8 pools of the same K/V: each checked against an fp32 reference over
    the values its pool holds, then timed (CUDA-graph replay)."""
    hq, hkv, d = HEADS[heads]
    x = ragged_decode_batch(heads, BLOCK)
    lengths, k, v, table, q, seq_lens = (x[key] for key in ("lengths", "k", "v", "table", "q", "seq_lens"))
    splits, tokens = num_kv_splits(max(lengths)), sum(lengths)
    out: dict = dict(heads=heads, batch=len(lengths), total_tokens=tokens, max_context=max(lengths), block_size=BLOCK)
    for name, (kc, vc, scales, kf, vf) in fp8_pools(k, v).items():
        ref = decode_reference(q, kf, vf, table, lengths, BLOCK)
        run = functools.partial(paged_decode_attention, q, kc, vc, table, seq_lens, splits, kv_scales=scales)
        row = dict(rel_err=checked(run(), ref, f"decode {heads} {name}"))
        nbytes = kv_bytes(tokens, hkv, d, name) + 2 * q.nbytes
        ms = median_ms(run)
        row.update(ms=round(ms, 4), bytes=nbytes, context_tokens_per_s=round(tokens / ms * 1e3),
                   tb_s=round(nbytes / ms / 1e9, 3), copy_tb_s=round(copy_bandwidth(nbytes) / 1e12, 3))
        if name != "bf16":
            row["tiles"] = []
            for block_n, warps in FP8_TILES:
                tile = functools.partial(run, block_n=block_n, num_warps=warps)
                checked(tile(), ref, f"decode {heads} {name} tile {block_n}x{warps}")
                row["tiles"].append(dict(block_n=block_n, warps=warps,
                                         context_tokens_per_s=round(tokens / median_ms(tile) * 1e3)))
        out[name] = row
    for name in ("fp8_token", "fp8_static"):
        out[name]["tokens_vs_bf16"] = round(out[name]["context_tokens_per_s"] / out["bf16"]["context_tokens_per_s"], 3)
    return out


def decode_once_for_ncu(heads: str = "32/8x128") -> None:
    """The ragged decode of `decode` once on each pool (bf16, fp8 per token, fp8 static), compiled first, so that
    Nsight Compute profiles one launch of each: where the fp8 kernel's time goes (instructions, stalls, bytes)."""
    x = ragged_decode_batch(heads, BLOCK)
    for name, (kc, vc, scales, _, _) in fp8_pools(x["k"], x["v"]).items():
        paged_decode_attention(x["q"], kc, vc, x["table"], x["seq_lens"], num_kv_splits(max(x["lengths"])),
                               kv_scales=scales)
        torch.cuda.synchronize()
        print("ran", name, flush=True)


def extend_rows(prefixes: list[int], news: list[int]) -> dict:
    """Prefill after a cached prefix, bf16 and fp8 pools of the same K/V, each checked against fp32 SDPA over the
    values its pool holds (every sequence of a ragged batch)."""
    x = extend_inputs(prefixes, news, BLOCK)
    out: dict = dict(batch=len(news), prefixes=prefixes, news=news, flops=x["flops"])
    for name, (kc, vc, scales, kf, vf) in fp8_pools(x["k"], x["v"]).items():
        run = functools.partial(extend_attention, x["q"], kc, vc, x["table"], x["qsl"], x["seq_lens"], max(news),
                                kv_scales=scales)
        err = check_prefill(run(), x, kf, vf, f"extend {name}", BLOCK)
        out[name] = dict(rel_err=err, tflop_s=round(x["flops"] / median_ms(run) / 1e9, 1))
    for name in ("fp8_token", "fp8_static"):
        out[name]["vs_bf16"] = round(out[name]["tflop_s"] / out["bf16"]["tflop_s"], 3)
    return out


def store_rows(tokens: int = 65536) -> dict:
    """store_kvcache into a bf16 and an fp8 pool (per-token scales): GB/s over the bytes read and written."""
    _, hkv, d = HEADS[LLAMA]
    num_blocks = 2 * tokens // BLOCK
    k = torch.randn(tokens, hkv, d, dtype=torch.bfloat16, device=DEVICE)
    v = torch.randn_like(k)
    slots = torch.randperm(num_blocks * BLOCK, device=DEVICE)[:tokens]
    out = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp8_token", FP8)):
        kc = torch.zeros(num_blocks, BLOCK, hkv, d, dtype=dtype, device=DEVICE)
        vc = torch.zeros_like(kc)
        scales = None if dtype != FP8 else tuple(torch.zeros(num_blocks, BLOCK, hkv, device=DEVICE) for _ in "kv")
        store_kvcache(k, v, kc, vc, slots, scales)
        want = (k, v) if scales is None else (quantize(k, token_scales(k)), quantize(v, token_scales(v)))
        got = [c.view(-1, hkv, d)[slots] for c in (kc, vc)]
        if dtype == FP8:  # bytes that differ from PyTorch's conversion, and by how much they read back
            diff = [(g.view(torch.uint8) != w.view(torch.uint8)) for g, w in zip(got, want)]
            wrong = sum(int(m.sum()) for m in diff)
            worst = max((float((g.float() - w.float()).abs()[m].max()) for g, w, m in zip(got, want, diff)
                         if m.any()), default=0.0)
            correct = wrong == 0
            extra = dict(bytes_differing=wrong, of_bytes=2 * k.numel(), largest_e4m3_difference=worst)
            if wrong:  # a few of them: the fp32 value the conversion rounds, and the two readings
                x, m, g, w = k.float() / token_scales(k)[..., None], diff[0], got[0], want[0]
                extra["examples"] = [dict(scaled=float(a), kernel=float(b), torch=float(c)) for a, b, c in zip(
                    x[m][:8].tolist(), g[m][:8].float().tolist(), w[m][:8].float().tolist())]
                print(f"store: {wrong} of {2 * k.numel()} e4m3 bytes differ from PyTorch's conversion", flush=True)
        else:
            correct, extra = all(torch.equal(g, w) for g, w in zip(got, want)), {}
            if not correct:
                raise AssertionError(f"store_kvcache into the {name} pool differs from the stored K/V")
        written = 2 * tokens * hkv * (d * kc.element_size() + (4 if scales else 0))
        ms = median_ms(lambda kc=kc, vc=vc, scales=scales: store_kvcache(k, v, kc, vc, slots, scales))
        out[name] = dict(correct=correct, gb_s=round((2 * k.nbytes + written) / ms / 1e6, 1), **extra)
    return out


IDENTITY_RUNS = {"torch": dict(graphs=False, attention_backend="torch"), "triton": dict(graphs=False),
                 "triton_graphs_fused_overlap": dict(overlap=True),
                 "triton_graphs_fused_cascade": dict(cascade=True, cascade_min_seqs=4)}
assert list(IDENTITY_RUNS)[1:] == IDENTITY_ENGINES


def identity_run(name: str) -> dict:
    """One engine of the fp32 identity check (IDENTITY_RUNS[name]): SmolLM2's shape, an fp8 pool, 8 requests behind
    a shared system prompt, 32 greedy tokens each; its tokens and how long building and running it took. One part
    per engine, so a run that stops at its time limit still says which engines finished and what each cost."""
    from .engine import engine_for, run_engine
    t0 = time.perf_counter()
    with exact_fp32():
        model = random_model(SMOLLM2_135M, torch.float32)
        prompts = [p[:n] for p, n in zip(workload("shared_system", model.config.vocab_size, seed=1)[0][:8],
                                         (1540, 1560, 1580, 1600, 300, 1620, 1550, 1570))]
        engine = engine_for(model, prompts, 32, kv_cache_dtype="fp8_e4m3", **IDENTITY_RUNS[name])
        built = time.perf_counter() - t0
        tokens = run_engine(engine, prompts, 32)[0]
    return dict(tokens=tokens, build_s=round(built, 1), total_s=round(time.perf_counter() - t0, 1))


def pool_differences(a, b) -> list[dict]:
    """Per layer, where two fp8 pools of one geometry with dynamic scales part once the same requests wrote them
    (both start zero-filled, scales 1): the e4m3 bytes of K and V that differ, the scales that differ and the
    largest relative difference between two scales."""
    rows = []
    for layer in range(a.k.shape[0]):
        scales = [(x[layer], y[layer]) for x, y in ((a.k_scale, b.k_scale), (a.v_scale, b.v_scale))]
        rows.append(dict(layer=layer, bytes_differing=sum(int((x[layer].view(torch.uint8) != y[layer].view(
            torch.uint8)).sum()) for x, y in ((a.k, b.k), (a.v, b.v))),
            scales_differing=sum(int((x != y).sum()) for x, y in scales),
            largest_scale_difference=max(float(((x - y).abs() / y).max()) for x, y in scales)))
    return rows


def pool_bytes(prompt_tokens: int = 1540) -> dict:
    """The torch path's pool against the kernels' (eager), fp32, SmolLM2's shape, random weights, after one prompt's
    prefill (`prompt_tokens` of the identity part's first request): per layer, the bytes and scales that differ.
    Both paths compute the first layer's K/V with the same code; the later layers' inputs carry the last-bit
    differences of two correct attention computations, which e4m3 rounding turns into a whole step now and then."""
    from .engine import engine_for
    with exact_fp32():
        model = random_model(SMOLLM2_135M, torch.float32)
        prompt = workload("shared_system", model.config.vocab_size, seed=1)[0][0][:prompt_tokens]
        pools = []
        for name in ("torch", "triton"):
            engine = engine_for(model, [prompt], 1, kv_cache_dtype="fp8_e4m3", **IDENTITY_RUNS[name])
            engine.generate([prompt], SamplingParams(max_new_tokens=1))
            pools.append(engine.pool)
    rows = pool_differences(*pools)
    written = prompt_tokens * model.config.num_kv_heads  # head rows each of K and V
    return dict(prompt_tokens=prompt_tokens, head_rows_written=written,
                bytes_written=2 * written * model.config.head_dim, layers=rows)


def capacity_prompts(vocab: int) -> list[list[int]]:
    c = CAPACITY
    g = torch.Generator().manual_seed(c["seed"])
    lens = torch.randint(c["prompt"][0], c["prompt"][1] + 1, (c["requests"],), generator=g).tolist()
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lens]


def capacity(rounds: int = 3) -> dict:
    """The same KV byte budget as a bf16 pool and as an fp8 pool, the same requests, all at once."""
    model = random_model(SMOLLM2_135M, torch.bfloat16)
    prompts, new = capacity_prompts(model.config.vocab_size), CAPACITY["new_tokens"]
    need_blocks = sum(cdiv(len(p) + new, BLOCK) for p in prompts)
    engines, out = {}, {}
    block_bytes = lambda dtype: make_kv_pool(model.config, PoolGeometry(1, BLOCK), dtype, model.dtype,  # noqa: E731
                                             "meta").bytes_per_block
    budget = int(CAPACITY["budget_of_bf16_need"] * need_blocks * block_bytes("auto"))
    for name, dtype in (("bf16", "auto"), ("fp8", "fp8_e4m3")):
        per_block = block_bytes(dtype)
        blocks = budget // per_block
        engines[name] = make_engine(model, "bridge", "triton", cuda_graphs=True, fuse=True, overlap=True,
                                    num_blocks=blocks, block_size=BLOCK, max_num_seqs=len(prompts),
                                    max_num_batched_tokens=8192, kv_cache_dtype=dtype)
        out[name] = dict(bytes_per_block=per_block, blocks=blocks, pool_bytes=blocks * per_block,
                         blocks_all_requests_need=need_blocks)
    params = SamplingParams(max_new_tokens=new)

    def run(engine) -> dict:
        engine.cache_manager.reset_cache()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = engine.generate(prompts, params)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        engine.check_invariants()
        lat, ttft = [r.latency_s for r in res], [r.ttft_s for r in res]
        assert all(len(r.output_ids) == new for r in res), "every request runs its new tokens (no stop token)"
        return dict(wall_s=round(wall, 3), tokens_per_s=round(len(prompts) * new / wall, 1),
                    preemptions=sum(r.num_preemptions for r in res), peak_blocks=engine.stats.peak_blocks,
                    latency_p50_s=round(sorted(lat)[len(lat) // 2], 3), latency_p99_s=round(p99(lat), 3),
                    ttft_p50_s=round(sorted(ttft)[len(ttft) // 2], 3), ttft_p99_s=round(p99(ttft), 3))
    for engine in engines.values():  # warm-up: compile, capture
        engine.generate(prompts[:4], SamplingParams(max_new_tokens=2))
    samples: dict[str, list[dict]] = {k: [] for k in engines}
    for _ in range(rounds):
        for name, engine in engines.items():
            samples[name].append(run(engine))
            print("capacity", name, samples[name][-1], flush=True)
    for name, figs in samples.items():
        mid = sorted(figs, key=lambda f: f["tokens_per_s"])[len(figs) // 2]
        out[name].update(mid, tokens_per_s_rounds=[f["tokens_per_s"] for f in figs])
    out.update(requests=len(prompts), prompt_tokens=sum(map(len, prompts)), new_tokens=new, budget_bytes=budget,
               budget=CAPACITY, speedup=round(out["fp8"]["tokens_per_s"] / out["bf16"]["tokens_per_s"], 2))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the JSON here (step06_triton/results/h200_fp8.json)")
    ap.add_argument("--parts", nargs="+", default=["identity", "decode", "extend", "capacity"],
                    choices=["identity", "pool_bytes", "decode", "extend", "capacity"])
    ap.add_argument("--quick", action="store_true", help="one capacity round (a smoke test)")
    ap.add_argument("--ncu", action="store_true", help="no JSON: the ragged decode once per pool, for Nsight Compute "
                    "(ncu --kernel-name regex:_decode_split_kernel)")
    args = ap.parse_args(argv)
    if not needs_gpu("benchmarks.step06.fp8"):
        return 2
    if args.ncu:
        decode_once_for_ncu()
        return 0
    parts = Parts(args.out, "python -m benchmarks.step06.fp8 " + " ".join(argv or sys.argv[1:]),
                  keep=args.parts != ap.get_default("parts"))
    if "identity" in args.parts:
        for name in IDENTITY_RUNS:
            parts.run(("identity_runs", name), functools.partial(identity_run, name))
    if "pool_bytes" in args.parts:
        parts.run(("pool_bytes",), pool_bytes)
    if "decode" in args.parts:
        for heads in HEADS:
            parts.run(("decode", heads), functools.partial(decode_rows, heads))
    if "extend" in args.parts:
        batch, prefix, new = PREFILL_SHAPE
        parts.run(("extend", "uniform"), functools.partial(extend_rows, [prefix] * batch, [new] * batch))
        parts.run(("extend", "ragged"), functools.partial(extend_rows, *ragged_prefill_shape()))
        parts.run(("extend", "store"), store_rows)
    if "capacity" in args.parts:
        parts.run(("capacity",), functools.partial(capacity, 1 if args.quick else 3))
    parts.finish(goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
