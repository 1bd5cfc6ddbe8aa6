"""The engine's half of chapter 6's measured results, from results/h200_engine.json (`python -m
benchmarks.step06.engine`):
throughput against Hugging Face `generate`, where a decode step's time goes, the write-up's time-to-first-token
benchmark, chapter 5's host tier on the GPU, the targets met or missed, and the timeline of host and GPU per step.
report.py puts it under the kernels' tables; nothing here measures."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.reporting import met

from .common import RESULTS, command_today
from .engine import cold_ms, floor_us, goals, warm_split

MODELS = {"smollm2_135m": "SmolLM2-135M's shape", "llama_3_2_1b": "a Llama-3.2-1B shape"}
CONTENDERS = {"engine_sync": "engine, synchronous (chapter 2's loop)", "engine_overlap": "engine, overlapped",
              "engine_overlap_compiled": "engine, overlapped, compiled step",
              "engine_no_cache": "engine, overlapped, no prefix cache",
              "hf_dynamic": "HF `generate`, batched, SDPA, dynamic cache",
              "hf_static": "HF `generate`, batched, SDPA, static cache"}


def load(path: Path = RESULTS / "h200_engine.json") -> dict:
    return json.loads(path.read_text())


def warm_request_rows(long: dict) -> list[str]:
    """The `long` benchmark's runners side by side, where the run measured more than the fused one: time to first
    token cold and warm, a warm request's GPU and host time, and its kernels (count, GPU µs, the costliest)."""
    runners = [(k, name) for k, name in (("cache_on", "hand-fused graphs"), ("cache_on_compiled", "compiled graphs"))
               if k in long]
    if len(runners) < 2:
        return []
    lines = ["| runner | cold median, ms | warm median, ms | warm forward, GPU µs | host µs per warm request | "
             "kernels of a warm request (GPU µs) | the costliest kernels (calls, µs) |",
             "|---|---|---|---|---|---|---|"]
    for key, name in runners:
        r = long[key]
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:120]} | | | | | |")
            continue
        k = r["warm_kernels"]
        top = "; ".join(f"`{n[:40]}` {c}, {us}" for n, c, us in k["top"][:3])
        lines.append(f"| {name} | {r['cold_median_ms']} | **{r['warm_median_ms']}** | {r['warm_forward_gpu_us']} | "
                     f"{r['host_us_per_warm_request']} | {k['kernels']} ({k['gpu_us']}) | {top} |")
    return lines + [""]


def throughput_rows(e: dict) -> list[str]:
    lines = ["| model | workload | contender | tokens/s (median of 3 rounds) | every round | x HF static | prompt "
             "tokens computed |", "|---|---|---|---|---|---|---|"]
    for model, label in MODELS.items():
        for wl in ("random", "shared_system"):
            r = e.get(model, {}).get(wl)
            if not r or "error" in r:
                continue
            for key, name in CONTENDERS.items():
                c = r.get(key)
                if c is None:
                    continue
                rounds = ", ".join(map(str, c["tokens_per_s_rounds"]))
                lines.append(f"| {label} | `{wl}` | {name} | **{c['tokens_per_s']}** | {rounds} | "
                             f"{c.get('ratio_vs_hf_static', '1.0' if key == 'hf_static' else '—')} | "
                             f"{c.get('prompt_tokens_computed', r['prompt_tokens'])} |")
    return lines


def decode_rows(e: dict, copy_tb_s: float | None = None) -> list[str]:
    lines = ["| model | workload | kernels per step | GPU µs per step (graph replay) | floor µs (weights + K/V read "
             "once at the ceiling's copy speed) | ms per step on the host's clock (sync: "
             "includes the wait for the GPU), sync / overlapped | GPU busy, sync / overlapped |",
             "|---|---|---|---|---|---|---|"]
    for model, label in MODELS.items():
        for wl in ("random", "shared_system"):
            r = e.get(model, {}).get(wl)
            if not r or "error" in r:
                continue
            d = r["decode"]
            floor = floor_us(d, copy_tb_s)
            lines.append(f"| {label} | `{wl}` | {d['kernels_per_step']} | {d['gpu_us_per_step']} | {floor} | "
                         f"{d['sync']['host_ms_per_step']} / {d['overlap']['host_ms_per_step']} | "
                         f"{d['sync']['gpu_busy_fraction']:.1%} / **{d['overlap']['gpu_busy_fraction']:.1%}** |")
    return lines


def earlier_note(e: dict) -> str:
    """Parts of the file kept from an earlier run, said as such (with the run's date, commands and why)."""
    old = e.get("earlier_run")
    if not old:
        return ""
    return (f" **From a separate run** ({old['date']}, " + ", ".join(f"`{command_today(c)}`" for c in old["commands"])
            + "): " + ", ".join(f"`{p}`" for p in old["parts"]) + f", {old['note']}.")


def tables(e: dict, copy_tb_s: float | None = None, pictures: str | None = "results") -> str:
    """The engine's block; `copy_tb_s`, the fastest copy the card made in the chapter's runs, sets the floors where
    this run's own copy probe read slower. `pictures` is the folder of the timeline's SVG relative to the page that
    shows the block (the chapter's results page reads `results`); None leaves the picture out, for a page that draws
    it."""
    m, ident = e["machine"], e["identity_fp32"]
    s = e["smollm2_135m"]
    lines = ["#### The engine end to end", "",
             f"Measured on {m['gpu']} ({m['cpu']} host), torch {m['torch']}, Triton {m['triton']}, on {m['date']}, by "
             + ", then ".join(f"`{command_today(c)}`" for c in e["commands"])
             + " (the later commands re-ran the parts they name into the same file). Random weights in each model's "
             "shape, bf16, 64 concurrent requests, 128 new tokens each, greedy; chapter 5's engine (the bridge) on the "
             "Triton kernels with fused CUDA-graph steps; Hugging Face batched, left-padded, SDPA; contenders "
             "interleaved over three rounds."
             + earlier_note(e), "",
             "| target | measured | |", "|---|---|---|"]
    lines += [f"| {g['goal']} | {g['measured']} | {met(g['met'])} |" for g in goals(
        {k: v for k, v in e.items() if k in MODELS}, copy_tb_s)]
    lines += ["", f"Token identity, fp32 ({ident['requests']} requests x {ident['new_tokens']} tokens, against the "
              "torch path): " + ", ".join(f"{k} {v}/{ident['requests']}"
                                          for k, v in ident["identical_requests_vs_torch"].items())
              + f"; host tier off vs on, {ident['host_tier']['identical']}/{ident['host_tier']['requests']} "
              f"multi-turn requests ({ident['host_tier']['blocks_loaded']} blocks loaded back).", ""]
    lines += throughput_rows(e)
    lines += ["", "**A decode step** (batch 64, the contexts of the run's last steps), and the decode phase:", ""]
    lines += decode_rows(e, copy_tb_s)
    if copy_tb_s:
        lines += ["", f"One ceiling for the floors: {copy_tb_s} TB/s, the ceiling of the kernels run on the same card "
                  "(its fastest device copy); a step is held against what the card can copy, not against a slower "
                  "probe of this run's."]
    if pictures is not None:
        lines += ["", f"![host and GPU per decode step, synchronous and overlapped]({pictures}/timeline.svg)"]
    lines += [""]
    long = s.get("long", {})
    if long and "error" not in long:
        on, off = long["cache_on"], long["cache_off"]
        gpu_us, host_us = warm_split(long)
        cold = (f"cold median {cold_ms(on)} ms ({on['requests']} requests, each after the cache was emptied)"
                if "cold_median_ms" in on else f"cold {cold_ms(on)} ms (the first request)")
        lines += [f"**The Pico-vLLM write-up's benchmark** (`long`: one request at a time, a 2,083-token shared prefix "
                  f"+ 35 tokens of its own; time to first token): {cold}, warm median **{on['warm_median_ms']} ms** "
                  f"({long['warm_over_cold']}x; the "
                  f"token bound is {long['token_bound']}x); without the prefix cache {off['warm_median_ms']} ms. "
                  "A warm request's forward is one replay of an extend graph: "
                  f"{gpu_us} µs of GPU; the rest, {host_us} µs, is "
                  "host work. One pass over the weights at copy "
                  f"speed would take {long['weight_pass_floor_us']} µs.", ""]
        lines += warm_request_rows(long)
    tier = s.get("host_tier", {})
    if tier and "error" not in tier:
        off, on, r = tier["tier_off"], tier["tier_on"], tier["rates"]
        lines += [f"**Chapter 5's host tier on the GPU** ({tier['requests']} turns of 16 conversations, one at a "
                  f"time, a device pool of {tier['device_blocks']} blocks, a pinned host pool of "
                  f"{tier['host_blocks']}): time to first token of the later turns, mean {off['ttft_mean_ms']} → "
                  f"**{on['ttft_mean_ms']} ms** ({tier['ttft_speedup']}x), p99 {off['ttft_p99_ms']} → "
                  f"{on['ttft_p99_ms']} ms; prompt tokens computed {off['prompt_tokens_computed']} → "
                  f"{on['prompt_tokens_computed']} ({on['blocks_loaded']} blocks loaded back, {on['blocks_saved']} "
                  f"saved). Copies {r['h2d_gb_s']} GB/s host to device, {r['d2h_gb_s']} back: "
                  f"{r['load_tokens_s']} tokens/s loaded against {r['prefill_tokens_s']} tokens/s prefilled. In "
                  f"bf16 with random weights, {tier['first_tokens_match']}/{tier['requests']} first tokens agree with "
                  "the tier off (near-tied argmaxes flip between two computations of the same K/V; the fp32 check "
                  "above is the identity test).", ""]
    return "\n".join(lines)


def plot_timeline(e: dict, out: Path) -> None:
    """Per decode step of SmolLM2's `random` run: the host's interval (top) and the GPU's graph replay (bottom),
    synchronous (the GPU waits while the host prepares the next step) against overlapped (it does not)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "kvcourse"
    d = e["smollm2_135m"]["random"]["decode"]
    fig, axes = plt.subplots(2, 1, figsize=(10, 3.6), sharex=True)
    for ax, mode in zip(axes, ("sync", "overlap")):
        t = d[mode]["timeline_ms"]
        span = min(40.0, t["host"][-1][1])
        for i, (a, b) in enumerate(t["host"]):
            if a < span:
                ax.broken_barh([(a, b - a)], (1.1, 0.8), color="tab:blue" if i % 2 else "tab:cyan")
        for i, (a, b) in enumerate(t["gpu"]):
            if a < span:
                ax.broken_barh([(a, b - a)], (0.1, 0.8), color="tab:red" if i % 2 else "tab:orange")
        ax.set(yticks=[0.5, 1.5], yticklabels=["GPU (replay)", "host (step)"], xlim=(0, span),
               title=f"{'synchronous' if mode == 'sync' else 'overlapped'}: host {d[mode]['host_ms_per_step']} ms "
                     f"per step, GPU busy {d[mode]['gpu_busy_fraction']:.0%} of the decode phase")
        ax.title.set_fontsize(9)
    axes[-1].set_xlabel("ms since the first decode step (SmolLM2's shape, 64 requests, H200)")
    fig.tight_layout()
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)
