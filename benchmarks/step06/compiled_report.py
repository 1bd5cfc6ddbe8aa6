"""The compiled runner's half of chapter 6's results, from results/<card>_compiled.json (`python -m
benchmarks.step06.compiled`): the hand-fused and the compiled decode step side by side (GPU µs, kernels, the gaps
between them, the floor), the compile's cost, the fp32 identity, and one middle layer's kernels drawn on a time axis
for both runners. report.py places it; nothing here measures."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.reporting import fmt, pyplot, save_svg

from .common import RESULTS, command_today

MODELS = {"smollm2_135m": "SmolLM2-135M's shape", "llama_3_2_1b": "a Llama-3.2-1B shape"}
RUNNERS = {"fused_graphs": "hand-fused, CUDA graphs", "compiled_graphs": "compiled (Inductor), CUDA graphs",
           "compiled_unmerged_graphs": "compiled, q/k/v and gate/up not merged"}
FIGURE = "compiled_timeline.svg"


def path() -> Path | None:
    """The committed compiled-runner JSON (an H200's before an H100's), or None before one ran."""
    found = [RESULTS / f"{card}_compiled.json" for card in ("h200", "h100")]
    return next((p for p in found if p.exists()), None)


def load(at: Path | None = None) -> dict | None:
    at = at or path()
    return json.loads(at.read_text()) if at else None


def runs(c: dict) -> list[tuple[str, str, dict]]:
    """(model label, runner label, its measurement) for every runner that ran without an error."""
    return [(MODELS[m], RUNNERS[r], c[m][r]) for m in MODELS for r in RUNNERS
            if isinstance(c.get(m, {}).get(r), dict) and "error" not in c[m][r]]


def tables(c: dict, pictures: str | None = "results") -> str:
    """The block: provenance, one row per runner and model, the identity line, and the timeline's picture."""
    m = c["machine"]
    lines = ["#### The compiled runner beside the hand-fused one", "",
             f"Measured on {m['gpu']}, torch {c['versions']['torch']}, Triton {c['versions']['triton']}, on "
             f"{m['date']}, by " + ", then ".join(f"`{command_today(x)}`" for x in c["commands"])
             + ". Random weights, bf16, 64 sequences of the `random` workload decoding; the decode step is one "
             "CUDA-graph replay, timed by CUDA events (median of 50) and profiled once (`torch.profiler`, CUDA "
             "activity). Floor: the weights and the batch's K/V read once at the card's copy speed "
             f"({c['copy_tb_s']} TB/s, this run's probe).", "",
             "| model | runner | GPU µs per step | floor µs | kernels per step | per layer | gaps between kernels, µs "
             "| engine step on the host's clock, ms | compile s | build s |", "|---" * 10 + "|"]
    for model, runner, r in runs(c):
        lines.append(f"| {model} | {runner} | **{fmt(r['gpu_us_per_step'])}** | {fmt(r['floor_us'])} | "
                     f"{r['kernels_per_step']} | {r['kernels_per_layer']} | {fmt(r['gaps_us'])} | "
                     f"{fmt(r['engine_step_ms_median'])} | {fmt(r.get('compile_s', '—'))} | {fmt(r['build_s'])} |")
    failed = [(MODELS[m], RUNNERS[r], c[m][r]["error"]) for m in MODELS for r in RUNNERS
              if isinstance(c.get(m, {}).get(r), dict) and "error" in c[m][r]]
    lines += [f"\n{model}, {runner}: failed on this card (`{err}`)." for model, runner, err in failed]
    for model, label in MODELS.items():
        ratio = c.get(model, {}).get("compiled_over_fused_us")
        if ratio is not None:
            lines.append(f"\n{label}: the compiled step takes {ratio}x the hand-fused step's GPU time.")
    ident = c.get("identity_fp32")
    if isinstance(ident, dict) and "error" not in ident:
        same = ", ".join(f"{k} {v}/{ident['requests']}" for k, v in ident["identical_requests_vs_eager"].items())
        lines += ["", f"Token identity, fp32, SmolLM2's shape ({ident['requests']} requests x {ident['new_tokens']} "
                  f"greedy tokens, against the eager Triton engine): {same}."]
    if pictures is not None and any(r.get("middle_layer") for _, _, r in runs(c)):
        lines += ["", f"![one decode layer's kernels on a time axis, hand-fused against compiled]({pictures}/{FIGURE})"]
    return "\n".join(lines) + "\n"


def layer_figure(c: dict):
    """Per runner of SmolLM2's shape, one middle layer of the replayed decode step: each kernel a bar from its
    start to its end (µs from the layer's first kernel), the gaps between them white. Returns the figure."""
    plt = pyplot()
    shown = [(runner, r) for model, runner, r in runs(c) if model == MODELS["smollm2_135m"] and r.get("middle_layer")]
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 1.3 + 1.1 * len(shown)), sharex=True, squeeze=False)
    for ax, (runner, r) in zip(axes[:, 0], shown):
        rows = r["middle_layer"]["timeline"]
        for i, k in enumerate(rows):
            ax.broken_barh([(k["start_us"], k["us"])], (0.1, 0.8), color="tab:red" if i % 2 else "tab:orange")
        end = rows[-1]["start_us"] + rows[-1]["us"] if rows else 0.0
        busy = sum(k["us"] for k in rows)
        ax.set(yticks=[], xlim=(0, max(end, 1.0)))
        ax.set_title(f"{runner}: {len(rows)} kernels, {busy:.1f} µs busy of {end:.1f} µs", fontsize=9)
    axes[-1, 0].set_xlabel("µs from the layer's first kernel (a middle layer of SmolLM2's shape, batch 64)")
    fig.tight_layout()
    return fig


def draw(c: dict, out: Path) -> None:
    save_svg(layer_figure(c), out)
