"""`python -m benchmarks.step06.compiled [--out FILE] [--parts ...]`: the hand-fused CUDA-graph runner and the compiled
runner side by side on a GPU, in one run.

Models: SmolLM2-135M's shape and a Llama-3.2-1B shape, random weights, bf16. Both runners serve the same 64 requests
of the `random` workload (200-600 prompt tokens); once every request decodes, the step that 64 sequences decode
is replayed from each runner's CUDA graph:
- the decode step's GPU time, the median of 50 replays timed by CUDA events;
- its kernels, from `torch.profiler` (CUDA activity) over one replay: how many per step and per layer, the gaps
  between them, and a per-layer timeline (a layer runs from its K/V store kernel to the next layer's), one
  middle layer's kernels by name with their µs;
- the floor its bytes set (weights + K/V read once at the card's copy speed), and each runner's build time (the
  compile, once per process and model, and the graph captures);
- the wall time of a decode step through the engine (host included), median over the remaining steps.
Then, fp32 on SmolLM2's shape: the greedy tokens of both runners equal the eager Triton engine's, request by request.
Last, SmolLM2's shape compiled without merging q/k/v and gate/up (what the compiler makes of chapter 1's model as
it is: Inductor fuses elementwise work, not products that read one input).
Each part is written to the JSON as soon as it ends; a part that fails leaves its error there and the others run.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from statistics import median

import torch

from step01_kvcache.model import Transformer
from step01_kvcache.request import SamplingParams
from step01_kvcache.tiny import SMOLLM2_135M
from step02_paged import Engine, EngineConfig
from step02_paged.geometry import cdiv
from step06_triton.compiled_runner import CompiledRunner
from step06_triton.engine import make_engine

from .common import MODELS, RESULTS, Parts, copy_bandwidth, error_text, exact_fp32, needs_gpu, random_model, replay_us
from .engine import workload

REQUESTS, NEW_TOKENS, BLOCK = 64, 64, EngineConfig.block_size
RUNNERS = {"fused_graphs": dict(cuda_graphs=True, fuse=True), "compiled_graphs": dict(cuda_graphs=True, compile=True)}
PARTS = ["smollm2_135m", "llama_3_2_1b", "identity", "unmerged"]
T0 = time.perf_counter()


def say(*what) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s]", *what, flush=True)


def build(model: Transformer, prompts: list[list[int]], new_tokens: int, **options) -> tuple[Engine, float]:
    """Chapter 5's engine on the Triton kernels with room for every request at once; (engine, seconds to build)."""
    blocks = sum(cdiv(len(p) + new_tokens, BLOCK) for p in prompts) + 64
    t0 = time.perf_counter()
    engine = make_engine(model, "bridge", "triton", num_blocks=blocks, block_size=BLOCK, max_num_seqs=len(prompts),
                         max_num_batched_tokens=2048, **options)
    torch.cuda.synchronize()
    return engine, time.perf_counter() - t0


def kernel_timeline(graph: torch.cuda.CUDAGraph, num_layers: int) -> dict:
    """One replay under the profiler (CUDA activity): its kernels in order, as `timeline` reads them."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    return timeline(kernels, num_layers)


def timeline(kernels: list[tuple[str, float, float]], num_layers: int) -> dict:
    """(name, start µs, end µs) of a step's kernels: how many, per step and per layer, the gaps between them; per
    layer (from its K/V store kernel to the next layer's; the last runs to the step's end, final norm and LM head
    included) the kernels, busy and gap µs; one middle layer kernel by kernel; the kernels by name."""
    kernels = sorted(kernels, key=lambda k: k[1])
    rows = []  # [name, start µs from the first kernel, µs, gap µs before it]
    for i, (name, start, end) in enumerate(kernels):
        gap = start - kernels[i - 1][2] if i else 0.0
        rows.append([name[:80], start - kernels[0][1], end - start, gap])
    stores = [i for i, r in enumerate(rows) if "store_kvcache" in r[0]]
    bounds = stores + [len(rows)]
    layers = [dict(kernels=b - a, busy_us=round(sum(r[2] for r in rows[a:b]), 1),
                   gaps_us=round(sum(r[3] for r in rows[a + 1:b]), 1)) for a, b in zip(bounds, bounds[1:])]
    first = stores[0] if stores else len(rows)
    mid = len(stores) // 2
    shown = rows[bounds[mid]:bounds[mid + 1]] if stores else rows[:40]
    by_name: dict[str, list[float]] = {}
    for r in rows:
        by_name.setdefault(r[0][:60], []).append(r[2])
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:16]
    return dict(kernels_per_step=len(rows), kernels_per_layer=round(len(rows) / num_layers, 1),
                layers_found=len(stores), profiled_span_us=round(rows[-1][1] + rows[-1][2], 1) if rows else 0.0,
                busy_us=round(sum(r[2] for r in rows), 1), gaps_us=round(sum(r[3] for r in rows), 1),
                before_first_layer=dict(kernels=first, busy_us=round(sum(r[2] for r in rows[:first]), 1)),
                per_layer=layers,
                middle_layer=dict(layer=mid, timeline=[
                    dict(kernel=r[0], start_us=round(r[1] - shown[0][1], 2), us=round(r[2], 2),
                         gap_before_us=round(r[3], 2)) for r in shown]),
                kernel_profile=[[name, len(t), round(sum(t), 1)] for name, t in top])


def decode_step(model: Transformer, runner: str, bandwidth: float) -> dict:
    """One runner on 64 decoding sequences: its build, its replayed decode step (time, kernels, timeline), the floor."""
    prompts, _ = workload("random", model.config.vocab_size)
    from torch._dynamo.utils import counters
    graphs_before = counters["stats"]["unique_graphs"]
    engine, build_s = build(model, prompts, NEW_TOKENS, **RUNNERS[runner])
    say(runner, f"built in {build_s:.1f} s")
    graphed = engine.runner
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    for p in prompts:
        engine.add_request(p, params)
    running = engine.scheduler.running
    while engine.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens for s in running):
        engine.step()
    before = Counter(graphed.replayed)
    for _ in range(3):
        engine.step()
    torch.cuda.synchronize()
    key = next((k for k in graphed.replayed if graphed.replayed[k] > before[k] and k[0] == "decode"), None)
    if key is None:
        raise RuntimeError(f"no decode step of {len(prompts)} sequences was replayed from a graph: {graphed.replayed}")
    graph = graphed.graphs[key]
    times = replay_us(graph, 50)
    cfg = model.config
    timeline = kernel_timeline(graph, cfg.num_layers)
    steps = []  # the engine's own decode steps, host included, to the end of the run
    while engine.has_unfinished():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        steps.append(time.perf_counter() - t0)
    engine.check_invariants()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_bytes = int(graphed.seq_lens[:key[1]].sum()) * cfg.kv_bytes_per_token(model.dtype.itemsize)
    out = dict(batch=key[1], split_axis=key[2], gpu_us_per_step=round(median(times), 1),
               gpu_us_min=round(min(times), 1), build_s=round(build_s, 2),
               engine_step_ms_median=round(median(steps) * 1e3, 3) if steps else None,
               weight_bytes=weight_bytes, kv_bytes=kv_bytes, copy_tb_s=round(bandwidth / 1e12, 3),
               floor_us=round((weight_bytes + kv_bytes) / bandwidth * 1e6, 1), **timeline)
    if isinstance(graphed, CompiledRunner):  # the compile's time, and how many graphs Dynamo made (1: no recompile)
        out.update(compile_s=round(graphed.compile_seconds, 2), dynamic=graphed.compiled.dynamic,
                   merged=graphed.compiled.merge, dynamo_graphs=counters["stats"]["unique_graphs"] - graphs_before)
    del engine, graph
    return out


def compiled_step(model: Transformer, bandwidth: float, merge: bool = True) -> dict:
    """The compiled runner's decode step, its token dimension unbacked, q/k/v and gate/up merged or not (`merge`); if
    that compile fails on this stack, the error is kept and a plain dynamic dimension (compiled again for one-token
    steps) is measured instead."""
    CompiledRunner.merge = merge
    try:
        return decode_step(model, "compiled_graphs", bandwidth)
    except Exception as exc:  # noqa: BLE001 - kept in the JSON, then the fallback
        import traceback
        traceback.print_exc()
        error = error_text(exc)
        torch._dynamo.reset()
        model.__dict__.pop("_compiled_forwards", None)
        CompiledRunner.dynamic = "backed"
        try:
            return dict(decode_step(model, "compiled_graphs", bandwidth), unbacked_error=error)
        finally:
            CompiledRunner.dynamic = "unbacked"
    finally:
        CompiledRunner.merge = True


def identity_fp32() -> dict:
    """fp32 (no TF32), SmolLM2's shape: 8 requests, 16 greedy tokens each, through the eager Triton engine, the
    hand-fused graph runner and the compiled runner (its graphs and its compiled steps without a graph); every
    request's tokens compared with the eager engine's."""
    with exact_fp32():
        model = random_model(SMOLLM2_135M, torch.float32)
        prompts = workload("random", model.config.vocab_size, seed=1)[0][:8]
        new = 16
        params = SamplingParams(max_new_tokens=new)
        engines = {"eager": {}, **RUNNERS}
        tokens, compile_s, replays = {}, None, None
        for name, options in engines.items():
            engine, _ = build(model, prompts, new, **options)
            tokens[name] = [o.output_ids for o in engine.generate(prompts, params)]
            if name == "compiled_graphs":
                compile_s = round(engine.runner.compile_seconds, 2)
                engine.cache_manager.reset_cache()  # one at a time: each prompt a cold chunk, then decodes of one row
                tokens["compiled_graphs_one_by_one"] = [engine.generate([p], params)[0].output_ids for p in prompts]
                replays = engine.runner.replays
            say("identity", name, "done")
            del engine
    same = {k: sum(a == b for a, b in zip(v, tokens["eager"])) for k, v in tokens.items()}
    return dict(requests=len(prompts), new_tokens=new, identical_requests_vs_eager=same, compile_s=compile_s,
                compiled_replays=replays, all_identical=all(v == len(prompts) for v in same.values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help=f"write the JSON here (e.g. {RESULTS.relative_to(RESULTS.parent.parent)}"
                    "/h200_compiled.json)")
    ap.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS, help="what to run, in this order (all by "
                    "default): each model's two runners, the fp32 identity, then SmolLM2's shape compiled without "
                    "merged products (q/k/v, gate/up: as chapter 1's model holds them)")
    args = ap.parse_args(argv)
    if not needs_gpu("benchmarks.step06.compiled"):
        return 2
    parts = Parts(args.out, "python -m benchmarks.step06.compiled " + " ".join(argv or sys.argv[1:]))
    torch._dynamo.config.recompile_limit = 32  # one code object compiles every model, dtype and variant here
    import triton
    parts.result["versions"] = dict(python=sys.version.split()[0], torch=torch.__version__, triton=triton.__version__)
    say("machine", parts.result["machine"])
    bandwidth = copy_bandwidth()
    parts.result["copy_tb_s"] = round(bandwidth / 1e12, 3)
    for name in (n for n in MODELS if n in args.parts):
        say(name, "random weights, bf16")
        model = random_model(MODELS[name], torch.bfloat16)
        fused = parts.run((name, "fused_graphs"), lambda m=model: decode_step(m, "fused_graphs", bandwidth))
        compiled = parts.run((name, "compiled_graphs"), lambda m=model: compiled_step(m, bandwidth))
        if "error" not in fused and "error" not in compiled:
            parts.result[name]["compiled_over_fused_us"] = round(compiled["gpu_us_per_step"] /
                                                                 fused["gpu_us_per_step"], 3)
        parts.save()
        del model
        torch.cuda.empty_cache()
    if "identity" in args.parts:
        parts.run(("identity_fp32",), identity_fp32)
    if "unmerged" in args.parts:
        model = random_model(SMOLLM2_135M, torch.bfloat16)
        parts.run(("smollm2_135m", "compiled_unmerged_graphs"), lambda: compiled_step(model, bandwidth, merge=False))
        del model
    for name in MODELS:
        for runner in (*RUNNERS, "compiled_unmerged_graphs"):
            r = parts.result.get(name, {}).get(runner, {})
            say(name, runner, *(f"{k}={r.get(k)}" for k in ("gpu_us_per_step", "kernels_per_layer", "gaps_us",
                                                              "floor_us", "compile_s", "error")))
    say("identity", parts.result.get("identity_fp32"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
