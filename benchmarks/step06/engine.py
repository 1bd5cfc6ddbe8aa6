"""`python -m benchmarks.step06.engine [--out FILE] [--quick]`: the course's final engine against Hugging Face
`generate` on a GPU, and where the time of a step goes.

Models: SmolLM2-135M's shape and a Llama-3.2-1B shape, random weights (the real ones do not travel to the GPU
machine), bf16. Workloads (random token ids, seeded):
- `random`: 64 requests of 200-600 prompt tokens, 128 new tokens each;
- `shared_system`: 64 requests behind one 1,536-token system prompt with 16-95 tokens of their own, 128 new;
- `long`: the Pico-vLLM write-up's benchmark — one request at a time, a 2,083-token shared prefix + 35 tokens of
  its own; the first request is cold, the others find the prefix cached (time to first token, cold vs warm);
- `host_tier`: chapter 5's host tier on conversations that come back (step05_bridge/tier_bench.py's GPU half).
Contenders: chapter 5's engine (the bridge cache) on the Triton kernels with fused CUDA-graph steps, synchronous
(`engine_sync`) and overlapped (`engine_overlap`), and overlapped with the compiled step in the graphs instead
(`engine_overlap_compiled`, compiled_runner.py); on `shared_system` also without a prefix cache
(`engine_no_cache`); Hugging Face `generate` batched, left-padded, SDPA, with its dynamic and its static cache.
Three rounds with the contenders interleaved; each contender is reported by its median round.

Where the time goes: every token of the fp32 runs is compared (engine sync == overlapped == torch path == HF);
one decode step's kernels are counted and timed against the floor that its bytes set (weights + K/V read, at the
card's copy bandwidth); the GPU's busy share of the decode phase is measured with CUDA events around every graph
replay, against the host's clock, and the per-step intervals are kept for the lesson's timeline picture.
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median

import torch

from benchmarks.step05.tier import host_tier_gpu, host_tier_identity_gpu
from step01_kvcache.hf import to_hf_model
from step01_kvcache.model import Transformer
from step01_kvcache.request import SamplingParams
from step01_kvcache.tiny import SMOLLM2_135M
from step02_paged import Engine, EngineConfig
from step02_paged.geometry import cdiv
from step06_triton.decode_attention import split_bucket
from step06_triton.engine import make_engine

from .common import MODELS, RESULTS, Parts, copy_bandwidth, error_text, exact_fp32, needs_gpu, random_model, replay_us

REQUESTS, NEW_TOKENS, ROUNDS = 64, 128, 3
BLOCK = EngineConfig.block_size
# engine tokens/s over HF static `generate`, per (model, workload)
GOALS = {("smollm2_135m", "random"): 3.0, ("llama_3_2_1b", "random"): 2.5, ("smollm2_135m", "shared_system"): 2.5}
ENGINES = ("engine_sync", "engine_overlap", "engine_overlap_compiled")  # the course's contenders a goal may count
graphed_engine = functools.partial(make_engine, attention_backend="triton", cuda_graphs=True, fuse=True)


def workload(name: str, vocab: int, seed: int = 0) -> tuple[list[list[int]], int]:
    """(prompts, new tokens per request) of a workload, random token ids (3.. vocab-1)."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    if name == "random":
        return [ids(n) for n in torch.randint(200, 601, (REQUESTS,), generator=g).tolist()], NEW_TOKENS
    if name == "shared_system":
        system = ids(1536)
        return [system + ids(n) for n in torch.randint(16, 96, (REQUESTS,), generator=g).tolist()], NEW_TOKENS
    if name == "long":
        prefix = ids(2083)
        return [prefix + ids(35) for _ in range(8)], 1
    raise ValueError(f"unknown workload {name!r}")


def engine_for(model: Transformer, prompts: list[list[int]], new_tokens: int, prefix_cache: str = "bridge",
               overlap: bool = False, graphs: bool = True, attention_backend: str = "triton", compile: bool = False,
               **options) -> Engine:
    """Chapter 5's engine with room for every request at once, the default block size, fused CUDA-graph steps
    (`compile`: the compiled step in the graphs instead of the hand-fused one)."""
    blocks = sum(cdiv(len(p) + new_tokens, BLOCK) for p in prompts) + 64
    return make_engine(model, prefix_cache, attention_backend, cuda_graphs=graphs, fuse=graphs and not compile,
                       overlap=overlap, compile=compile, num_blocks=blocks, block_size=BLOCK,
                       max_num_seqs=len(prompts), max_num_batched_tokens=8192, **options)


def run_engine(engine: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], dict]:
    """All requests at once on a drained engine whose prefix cache was emptied (every round starts cold)."""
    engine.cache_manager.reset_cache()
    steps = engine.stats.steps
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    results = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens))
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    engine.check_invariants()
    outs = [r.output_ids for r in results]
    cached = sum(r.num_cached_tokens for r in results)
    return outs, dict(wall_s=round(wall, 4), tokens_per_s=round(sum(map(len, outs)) / wall, 1),
                      ttft_mean_s=round(sum(r.ttft_s for r in results) / len(results), 4),
                      steps=engine.stats.steps - steps, prompt_tokens_computed=sum(map(len, prompts)) - cached)


def run_hf(hf, prompts: list[list[int]], new_tokens: int, cache: str | None,
           max_batch: int | None = None) -> tuple[list[list[int]], dict]:
    """Hugging Face `generate`, all requests in one left-padded batch (or, with `max_batch`, in consecutive batches
    of that many, their times added), SDPA; each request's own tokens counted."""
    if max_batch and len(prompts) > max_batch:
        outs, wall = [], 0.0
        for i in range(0, len(prompts), max_batch):
            part, fig = run_hf(hf, prompts[i:i + max_batch], new_tokens, cache)
            outs += part
            wall += fig["wall_s"]
        return outs, dict(wall_s=round(wall, 4), tokens_per_s=round(len(prompts) * new_tokens / wall, 1),
                          batch=max_batch)
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), 2, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.cuda(), mask.cuda()
    kwargs = dict(attention_mask=mask, do_sample=False, pad_token_id=2, max_new_tokens=new_tokens,
                  min_new_tokens=new_tokens)
    if cache:
        kwargs["cache_implementation"] = cache
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(ids, **kwargs)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return out[:, width:].tolist(), dict(wall_s=round(wall, 4), tokens_per_s=round(len(prompts) * new_tokens / wall, 1))


def throughput(model: Transformer, name: str, rounds: int) -> dict:
    """Every contender on workload `name`, rounds interleaved (a slow spell of the machine hits all of them),
    each reported by its median round; warm-up runs first (graph capture, compilation, autotuning)."""
    prompts, new = workload(name, model.config.vocab_size)
    hf = to_hf_model(model, "sdpa")
    engines = {"engine_sync": engine_for(model, prompts, new),
               "engine_overlap": engine_for(model, prompts, new, overlap=True),
               "engine_overlap_compiled": engine_for(model, prompts, new, overlap=True, compile=True)}
    if name == "shared_system":
        engines["engine_no_cache"] = engine_for(model, prompts, new, prefix_cache="none", overlap=True)
    runs: dict[str, Callable[[], tuple]] = {k: (lambda e=e: run_engine(e, prompts, new)) for k, e in engines.items()}
    runs["hf_dynamic"] = lambda: run_hf(hf, prompts, new, None)
    runs["hf_static"] = lambda: run_hf(hf, prompts, new, "static")
    tokens, failed = {}, {}
    for k, fn in runs.items():  # warm-up (the compiled runner compiles here; if it fails, the others still run)
        try:
            tokens[k] = fn()[0]
        except Exception as exc:  # noqa: BLE001
            if k != "engine_overlap_compiled":
                raise
            failed[k] = dict(error=error_text(exc))
    for k in failed:
        del runs[k], engines[k]
    samples: dict[str, list[dict]] = {k: [] for k in runs}
    for r in range(rounds):
        for k, fn in runs.items():
            tokens[k], fig = fn()
            samples[k].append(fig)
            print(f"{name} round {r} {k} {fig}", flush=True)
    out: dict = dict(requests=len(prompts), prompt_tokens=sum(map(len, prompts)), new_tokens=new, **failed)
    for k, figs in samples.items():
        mid = sorted(figs, key=lambda f: f["tokens_per_s"])[len(figs) // 2]
        out[k] = {**mid, "tokens_per_s_rounds": [f["tokens_per_s"] for f in figs]}
    hf_static = out["hf_static"]["tokens_per_s"]
    for k in engines:
        out[k]["ratio_vs_hf_static"] = round(out[k]["tokens_per_s"] / hf_static, 2)
        out[k]["ratio_vs_hf_dynamic"] = round(out[k]["tokens_per_s"] / out["hf_dynamic"]["tokens_per_s"], 2)
    out["overlap_same_tokens_as_sync"] = tokens["engine_overlap"] == tokens["engine_sync"]
    if "engine_overlap_compiled" in engines:  # compiled and fused bf16 steps may round near-tied argmaxes apart
        out["compiled_same_tokens_as_overlap"] = sum(
            a == b for a, b in zip(tokens["engine_overlap_compiled"], tokens["engine_overlap"]))
    out["decode"] = decode_profile(engines["engine_sync"], engines["engine_overlap"], prompts, new)
    return out


# ---- where the time of a decode step goes --------------------------------------------------------------------

def decode_profile(sync: Engine, overlap: Engine, prompts: list[list[int]], new_tokens: int) -> dict:
    """One replayed decode step (the largest batch, with the contexts its static buffers hold from the last run):
    kernels, GPU time and the floor its bytes set; then the GPU's busy share of the decode phase and a per-step
    timeline, for the synchronous and the overlapped engine."""
    graph_model = sync.runner
    size = max(b for b in graph_model.decode_sizes if b <= len(prompts))
    splits = split_bucket(graph_model.split_axes, int(graph_model.seq_lens[:size].max()))
    graph = graph_model.graphs["decode", size, splits]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    launched = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = len(launched)
    by_name: dict[str, list[float]] = {}  # the profile of one step: which kernels, how many, how long (µs)
    for e in launched:
        by_name.setdefault(e.name[:60], []).append(e.device_time)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:14]
    times = replay_us(graph, 30)
    model = graph_model.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    context = int(graph_model.seq_lens[:size].sum())
    kv_bytes = context * model.config.kv_bytes_per_token(model.dtype.itemsize)
    bandwidth = copy_bandwidth()
    out = dict(batch=size, split_axis=splits, kernels_per_step=kernels,
               kernels_per_layer=round(kernels / model.config.num_layers, 1),
               kernel_profile=[[name, len(t), round(sum(t), 1)] for name, t in top],
               gpu_us_per_step=round(median(times), 1),
               weight_bytes=weight_bytes, kv_bytes=kv_bytes, copy_tb_s=round(bandwidth / 1e12, 3),
               floor_us=round((weight_bytes + kv_bytes) / bandwidth * 1e6, 1))
    for name, engine in (("sync", sync), ("overlap", overlap)):
        out[name] = busy_and_timeline(engine, prompts, new_tokens)
    return out


def busy_and_timeline(engine: Engine, prompts: list[list[int]], new_tokens: int, shown: int = 24) -> dict:
    """Run the workload; once every request decodes, time the rest: each step's host interval (Python clock) and
    its graph replay's GPU interval (CUDA events around the replay, which runs no host code). The GPU's busy share
    of the decode phase is the replays' time over the phase's wall time (the few small kernels outside the graph,
    input copies and the argmax, are left out: the share is a lower bound). No profiler: tracing every kernel
    would slow the GPU itself."""
    engine.cache_manager.reset_cache()
    for p in prompts:
        engine.add_request(p, SamplingParams(max_new_tokens=new_tokens))
    running = engine.scheduler.running
    while engine.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens for s in running):
        engine.step()
    graphed, steps = engine.runner, []
    graphed.timings = []
    torch.cuda.synchronize()
    ref = torch.cuda.Event(enable_timing=True)
    ref.record()
    t_ref = t0 = time.perf_counter()
    while engine.has_unfinished():
        s = time.perf_counter()
        engine.step()
        steps.append((s, time.perf_counter()))
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    replays, graphed.timings = graphed.timings, None
    engine.check_invariants()
    gpu = [(t_ref + ref.elapsed_time(a) / 1e3, t_ref + ref.elapsed_time(b) / 1e3) for a, b in replays]
    busy = sum(b - a for a, b in gpu)
    origin = steps[0][0]
    ms = lambda t: round((t - origin) * 1e3, 3)  # noqa: E731
    return dict(decode_steps=len(steps), replays=len(gpu), decode_wall_ms=round(wall * 1e3, 2),
                host_ms_per_step=round(median(e - s for s, e in steps) * 1e3, 3),
                gpu_ms_per_step=round(median(b - a for a, b in gpu) * 1e3, 3),
                gpu_busy_fraction=round(busy / wall, 3),
                timeline_ms=dict(host=[[ms(s), ms(e)] for s, e in steps[:shown]],
                                 gpu=[[ms(a), ms(b)] for a, b in gpu[:shown]]))


# ---- the write-up's benchmark: time to first token, cold and warm -------------------------------------------

def long_ttft(model: Transformer) -> dict:
    """Time to first token of the write-up's benchmark, as medians of 8 requests each: *cold*, every request after
    the cache was emptied (it computes all 2,118 tokens); *warm*, every request right after another one left the
    2,083-token prefix cached (it computes 38); `cold_runs_ms` and `warm_ms` hold each request's. The hand-fused
    runner with and without the prefix cache, and the compiled runner with it (`cache_on_compiled`), in one run;
    for each runner with the cache, host microseconds per warm request (its wall time minus its GPU time), a
    warm request's kernels (`warm_kernels`), and for the fused one where its host time goes (`host_profile`); what
    bounds a warm request: the token bound, and one pass over the weights."""
    prompts, _ = workload("long", model.config.vocab_size)
    params = SamplingParams(max_new_tokens=1)
    result = {}
    for name, cache, compiled in (("cache_on", "bridge", False), ("cache_off", "none", False),
                                  ("cache_on_compiled", "bridge", True)):
        try:
            engine = engine_for(model, prompts, 1, prefix_cache=cache, compile=compiled)
            t0 = time.perf_counter()
            engine.generate(prompts[:2], params)  # warm-up: compile, capture, allocator
            warmup_s = time.perf_counter() - t0
            runs = ttft_runs(engine, prompts, params, cached=2080 if cache != "none" else 0)
        except Exception as exc:  # noqa: BLE001 - a runner that fails is reported, the others still measured
            if not compiled:
                raise
            result[name] = dict(error=error_text(exc))
            continue
        cold, warm = ([w for w, _ in runs[k]] for k in ("cold", "warm"))
        result[name] = dict(cold_median_ms=round(median(cold) * 1e3, 3), warm_median_ms=round(median(warm) * 1e3, 3),
                            cold_runs_ms=[round(t * 1e3, 3) for t in cold], warm_ms=[round(t * 1e3, 3) for t in warm],
                            requests=len(prompts), replays=getattr(engine.runner, "replays", 0),
                            warmup_s=round(warmup_s, 2))
        if cache == "none":
            continue
        # a warm request's forward is one extend-graph replay; the rest is host work
        result[name].update(warm_forward_gpu_us=round(median(g for _, g in runs["warm"]) * 1e6, 1),
                            host_us_per_warm_request=round(median(w - g for w, g in runs["warm"]) * 1e6, 1),
                            warm_kernels=warm_kernels(engine, prompts[1]))
        if compiled:
            result[name]["compile_s"] = round(engine.runner.compile_seconds, 2)
        else:
            result["host_profile"] = host_profile(engine, prompts[1:], params)
    on = result["cache_on"]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    result.update(warm_over_cold=round(on["cold_median_ms"] / on["warm_median_ms"], 2),
                  token_bound=round(len(prompts[1]) / (len(prompts[1]) - 2080), 1),
                  weight_pass_floor_us=round(weights / copy_bandwidth() * 1e6, 1))
    return result


def ttft_runs(engine: Engine, prompts: list[list[int]], params: SamplingParams,
              cached: int) -> dict[str, list[tuple[float, float]]]:
    """(wall s, GPU s of the replayed forward) of each cold and each warm request: cold after emptying the cache,
    warm right after the next prompt's cold run left the prefix cached; `cached`: the tokens a warm request finds."""
    runs: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    for i, p in enumerate(prompts):
        engine.cache_manager.reset_cache()
        for kind, prompt in (("cold", p), ("warm", prompts[(i + 1) % len(prompts)])):
            engine.runner.timings = []
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = engine.generate([prompt], params)[0]
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            gpu = sum(a.elapsed_time(b) for a, b in engine.runner.timings) / 1e3
            engine.runner.timings = None
            runs[kind].append((wall, gpu))
            assert out.num_cached_tokens == (cached if kind == "warm" else 0)
    return runs


def warm_kernels(engine: Engine, prompt: list[int], top: int = 12) -> dict:
    """The kernels of one warm request (the prefix cached by a run just before), from torch.profiler: how many,
    their GPU µs in all, and the ones with the most time (name, count, µs)."""
    engine.cache_manager.reset_cache()
    engine.generate([prompt], SamplingParams(max_new_tokens=1))
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=torch.profiler.supported_activities()) as prof:  # kernels: the CUDA ones
        engine.generate([prompt], SamplingParams(max_new_tokens=1))
        torch.cuda.synchronize()
    launched = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for e in launched:
        by_name.setdefault(e.name[:60], []).append(e.device_time)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return dict(kernels=len(launched), gpu_us=round(sum(e.device_time for e in launched), 1),
                top=[[n, len(t), round(sum(t), 1)] for n, t in ranked])


def cold_ms(on: dict) -> float:
    """A `long` run's cold time to first token: the median of its cold requests, or, in a file written before
    cold requests were repeated, its one cold request (`cold_ms`)."""
    return on["cold_median_ms"] if "cold_median_ms" in on else on["cold_ms"]


def warm_split(long: dict) -> tuple[float, float]:
    """A `long` run's warm request with the fused runner: (GPU µs of its forward, host µs), kept in `cache_on`, or
    at the run's top level in a file written before the compiled runner was measured beside it."""
    at = long["cache_on"] if "warm_forward_gpu_us" in long["cache_on"] else long
    return at["warm_forward_gpu_us"], at["host_us_per_warm_request"]


def host_profile(engine: Engine, prompts: list[list[int]], params: SamplingParams, top: int = 14) -> dict:
    """Where a warm request's host time goes: cProfile over the same warm requests again (the profiler's own cost
    inflates every call about alike, so read the shares), the functions with the most time of their own, per
    request."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for p in prompts:
        engine.generate([p], params)
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof).stats
    total = sum(row[2] for row in stats.values())
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    n = len(prompts)
    return dict(requests=n, profiled_us_per_request=round(total / n * 1e6, 1), functions=[
        dict(function=f"{Path(file).name}:{line}({func})", calls_per_request=round(calls / n, 1),
             own_us=round(own / n * 1e6, 1), cumulative_us=round(cum / n * 1e6, 1))
        for (file, line, func), (_, calls, own, cum, _) in rows])


# ---- identity, fp32 ---------------------------------------------------------------------------------------------

def identity_fp32() -> dict:
    """fp32, SmolLM2's shape: every contender's greedy tokens, request by request, equal the torch path's (bf16 with
    random weights flips near-tied argmaxes between any two correct implementations, so identity is checked here)."""
    with exact_fp32():
        model = random_model(SMOLLM2_135M, torch.float32)
        prompts = [p[:n] for p, n in zip(workload("shared_system", model.config.vocab_size, seed=1)[0][:8],
                                         (1540, 1560, 1580, 1600, 300, 1620, 1550, 1570))]
        prompts[4] = workload("random", model.config.vocab_size, seed=1)[0][4]
        runs = {"torch": engine_for(model, prompts, 32, graphs=False, attention_backend="torch"),
                "triton": engine_for(model, prompts, 32, graphs=False),
                "triton_graphs_fused": engine_for(model, prompts, 32),
                "triton_graphs_fused_overlap": engine_for(model, prompts, 32, overlap=True),
                "triton_graphs_fused_cascade": engine_for(model, prompts, 32, cascade=True, cascade_min_seqs=4)}
        tokens = {k: run_engine(e, prompts, 32)[0] for k, e in runs.items()}
        tokens["hf_sdpa"] = run_hf(to_hf_model(model, "sdpa"), prompts, 32, None)[0]
        # one at a time: later requests hit the shared prefix and run their own tokens from the extend graphs
        one_by_one = runs["triton_graphs_fused"]
        one_by_one.cache_manager.reset_cache()
        params = SamplingParams(max_new_tokens=32)
        tokens["triton_graphs_fused_one_by_one"] = [one_by_one.generate([p], params)[0].output_ids for p in prompts]
        same = {k: sum(a == b for a, b in zip(v, tokens["torch"])) for k, v in tokens.items()}
        tier = host_tier_identity_gpu(model, graphed_engine)
    return dict(requests=len(prompts), new_tokens=32, identical_requests_vs_torch=same, host_tier=tier,
                all_identical=all(v == len(prompts) for v in same.values()) and tier["all_identical"])


def floor_us(decode: dict, copy_tb_s: float | None = None) -> float:
    """A decode step's floor: its weights and K/V read once at copy speed, the run's own probe or `copy_tb_s` (the
    fastest copy the card made in the chapter's runs) where that is faster."""
    bandwidth = max(decode["copy_tb_s"], copy_tb_s or 0.0) * 1e12
    return round((decode["weight_bytes"] + decode["kv_bytes"]) / bandwidth * 1e6, 1)


def goals(res: dict, copy_tb_s: float | None = None) -> list[dict]:
    """The chapter's targets (JSON key `goals`), met or missed, from whatever parts ran (a part that failed has
    no number). `copy_tb_s`: judge the floors at this copy speed where the run's own probe read slower."""
    res = {m: {wl: r for wl, r in by.items() if "error" not in r} for m, by in res.items()}
    rows = []
    for (model, wl), target in GOALS.items():
        if model in res and wl in res[model]:
            best = max(res[model][wl][k]["ratio_vs_hf_static"] for k in ENGINES if "tokens_per_s" in
                       res[model][wl].get(k, {}))
            rows.append(dict(goal=f"{model} {wl}: engine >= {target}x HF static tokens/s", measured=best,
                             met=best >= target))
    for model, by in res.items():
        if isinstance(by, dict) and "random" in by:
            busy = by["random"]["decode"]["overlap"]["gpu_busy_fraction"]
            rows.append(dict(goal=f"{model} random: GPU busy >= 85% of the decode phase (overlap)", measured=busy,
                             met=busy >= 0.85))
            d = by["random"]["decode"]
            if model == "smollm2_135m":
                rows.append(dict(goal=f"{model}: a decode step of 64 sequences <= 1.0 ms of GPU",
                                 measured=round(d["gpu_us_per_step"] / 1e3, 3), met=d["gpu_us_per_step"] <= 1000))
                rows.append(dict(goal=f"{model}: <= 12 kernels per layer in a decode step",
                                 measured=d.get("kernels_per_layer"), met=d.get("kernels_per_layer", 99) <= 12))
            else:
                ratio = round(d["gpu_us_per_step"] / floor_us(d, copy_tb_s), 2)
                rows.append(dict(goal=f"{model}: a decode step within 1.5x of its floor", measured=ratio,
                                 met=ratio <= 1.5))
        if isinstance(by, dict) and "long" in by:
            on = by["long"]["cache_on"]
            rows.append(dict(goal=f"{model} long: warm TTFT <= 1.0 ms", measured=on["warm_median_ms"],
                             met=on["warm_median_ms"] <= 1.0))
            rows.append(dict(goal=f"{model} long: cold TTFT <= 8 ms", measured=cold_ms(on), met=cold_ms(on) <= 8))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help=f"write the JSON here (e.g. {RESULTS.relative_to(RESULTS.parent.parent)}"
                    "/h200_engine.json)")
    ap.add_argument("--quick", action="store_true", help="one round, SmolLM2's shape only (a smoke test)")
    ap.add_argument("--workloads", nargs="+", default=["random", "shared_system", "long", "host_tier"],
                    choices=["random", "shared_system", "long", "host_tier"], help="on SmolLM2's shape; the 1B "
                    "shape runs `random`")
    ap.add_argument("--parts", nargs="+", help="only these parts: identity, MODEL:WORKLOAD (e.g. llama_3_2_1b:random);"
                    " with --out, an existing file keeps the other parts")
    args = ap.parse_args(argv)
    if not needs_gpu("benchmarks.step06.engine"):
        return 2
    parts = Parts(args.out, "python -m benchmarks.step06.engine " + " ".join(argv or sys.argv[1:]),
                  keep=bool(args.parts))
    if not args.parts or "identity" in args.parts:
        parts.run(("identity_fp32",), identity_fp32)
    plan = [("smollm2_135m", wl) for wl in args.workloads] + \
        ([] if args.quick else [("llama_3_2_1b", wl) for wl in args.workloads if wl == "random"])
    if args.parts:
        plan = [(m, wl) for m, wl in plan if f"{m}:{wl}" in args.parts]
    models: dict[str, Transformer] = {}
    for name, wl in plan:  # the 1B shape runs `random`, the workload its target is set on
        if name not in models:
            models.clear()
            torch.cuda.empty_cache()
            models[name] = random_model(MODELS[name], torch.bfloat16)
        model = models[name]
        run: Callable[[], dict] = {
            "long": lambda m=model: long_ttft(m),
            "host_tier": lambda m=model: host_tier_gpu(m, graphed_engine)}.get(
            wl, lambda m=model, wl=wl: throughput(m, wl, 1 if args.quick else ROUNDS))
        parts.run((name, wl), run)
        parts.result["goals"] = goals({k: v for k, v in parts.result.items() if k in MODELS})
        parts.save()
    for g in parts.result.get("goals", []):
        print(("MET   " if g["met"] else "MISSED"), g["goal"], g["measured"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
