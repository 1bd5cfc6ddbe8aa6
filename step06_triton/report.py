"""`python -m step06_triton.report [--write]`: the chapter's tables and roofline plot, from results/h200.json.

Runs on a CPU: it only reads the JSON that `python -m step06_triton.bench --json --out
step06_triton/results/h200.json` wrote on the GPU. Prints the markdown that README.md shows between its
`results` markers; `--write` also puts it there and redraws results/roofline.svg.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from course import report as course_report

RESULTS = Path(__file__).parent / "results"
README = Path(__file__).parent / "README.md"
BEGIN, END = "<!-- results:begin (python -m step06_triton.report --write) -->", "<!-- results:end -->"
HQ, D = 32, 128
COLORS = {"triton": "tab:red", "gather": "tab:orange", "flex": "tab:blue", "contiguous": "tab:green"}


def load(path: Path = RESULTS / "h200.json") -> dict:
    return json.loads(path.read_text())


def _met(goal: dict) -> str:
    return "met" if goal["met"] else "**missed**"


def tables(res: dict) -> str:
    m, k = res["machine"], res["kernels"]
    lines = [f"Measured on {m['gpu']} ({m['sms']} SMs), torch {m['torch']}, Triton {m['triton']}, on {m['date']}: "
             f"device copy {k['ceilings']['copy_tb_s']} TB/s (bytes read + written), bf16 matmul "
             f"{k['ceilings']['matmul_tflop_s']} TFLOP/s. Command: `python -m step06_triton.bench --sweep --json --out "
             "step06_triton/results/h200.json` (on the GPU machine).", "",
             "**Decode attention**, bf16, 32 query / 8 KV heads, head_dim 128, TB/s (K/V and q read, output written):",
             "", "| batch x context | block | splits | Triton (ours) | gather + SDPA | course torch path | "
             "FlexAttention paged | contiguous SDPA (no paging) |", "|---|---|---|---|---|---|---|---|"]
    for r in k["decode"]:
        flex = r["flex_paged"].get("tb_s", "n/a (blocks < 16)" if r["block_size"] < 16 else "error")
        lines.append(f"| {r['batch']} x {r['context']} | {r['block_size']} | {r['num_splits']} | "
                     f"**{r['triton_tb_s']}** | {r['gather_sdpa_tb_s']} | {r['course_torch_tb_s']} | {flex} | "
                     f"{r['contiguous_sdpa_tb_s']} |")
    p, s = k["prefill"], k["store"]
    lines += ["", f"**Prefill with a cached prefix** (batch {p['batch']}, prefix {p['prefix']}, {p['new']} new tokens, "
              f"block {p['block_size']}), TFLOP/s over the visible query-key pairs: Triton **{p['triton_tflop_s']}**, "
              f"SDPA (contiguous, causal bottom-right) {p['sdpa'].get('tflop_s', p['sdpa'].get('error'))}, "
              f"FlexAttention (contiguous) {p['flex'].get('tflop_s', p['flex'].get('error'))}.", "",
              f"**store_kvcache** ({s['tokens']} tokens into random slots): Triton **{s['triton_gb_s']} GB/s**, "
              f"torch index_put {s['torch_index_put_gb_s']} GB/s.", "", "| goal | measured | |", "|---|---|---|"]
    lines += [f"| {g['goal']} | {g['measured']} | {_met(g)} |" for g in k["goals"]]
    if "engine" in res:
        e = res["engine"]
        w = e["workload"]
        lines += ["", f"**End to end**: chapter 5's engine on SmolLM2-135M's architecture (random weights), "
                  f"{w['requests']} concurrent requests, {w['prompt_tokens']} prompt tokens in all, "
                  f"{w['new_tokens']} new tokens each, {w['dtype']}; the contenders alternate over three rounds, "
                  "each reported by its median round:", "",
                  "| | tokens/s | every round | TTFT (s) |", "|---|---|---|---|"]
        names = {"engine_torch": "engine, torch attention (chapter 2's path)",
                 "engine_triton": "engine, Triton kernels",
                 "engine_triton_graphs": "engine, Triton + CUDA-graph decode",
                 "engine_triton_graphs_fused": "engine, Triton + CUDA graphs + fused RMSNorm/SwiGLU",
                 "hf_dynamic": "Hugging Face generate, batched, SDPA, dynamic cache",
                 "hf_static": "Hugging Face generate, batched, SDPA, static cache"}
        for key, label in names.items():
            r = e.get(key, {})
            ttft = r.get("ttft_mean_s", r.get("ttft_batch_s", "—"))
            rounds = ", ".join(map(str, r.get("tokens_per_s_rounds", [])))
            lines.append(f"| {label} | {r.get('tokens_per_s', r.get('error', '—'))} | {rounds} | {ttft} |")
        ident = e["identity_fp32"]
        g, t, fused = e["goal"], e["where_time_goes"], e["engine_triton_graphs_fused"]
        fused_ms = fused["wall_s"] / fused["steps"] * 1e3
        lines += ["", f"Token identity in fp32 ({ident['requests']} requests x {ident['new_tokens']} tokens): "
                  f"{ident['identical_requests_vs_torch']} of {ident['requests']} requests identical to the torch "
                  "backend.", "", f"| {g['goal']} | {g['measured']} vs {g['hf_static']} "
                  f"({g['measured'] / g['hf_static']:.2f}x) | {_met(g)} |", "|---|---|---|",
                  "", f"Where the time goes (fused graphs): {fused_ms:.2f} ms per engine step on average "
                  f"({fused['wall_s']} s / {fused['steps']} steps, prefill steps included), of which a replayed "
                  f"decode step of batch {w['requests']} keeps the GPU busy {t['gpu_ms_per_decode_step']} ms; prefill "
                  "steps and Python take the rest. Python per step by part, under cProfile (which inflates it; "
                  "compare the parts): "
                  + ", ".join(f"`{k_}` {v} ms" for k_, v in t["cumulative_ms_per_step"].items()
                              if v and k_ != "engine.py:step") + "."]
    return "\n".join(lines) + "\n"


def plot(res: dict, out: Path = RESULTS / "roofline.svg") -> None:
    """Left: the roofline (achieved TFLOP/s against FLOP per byte, under the copy and matmul ceilings).
    Right: decode TB/s per shape and block size, against the copy limit."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "kvcourse"  # deterministic ids in the SVG
    k = res["kernels"]
    copy, mm = k["ceilings"]["copy_tb_s"], k["ceilings"]["matmul_tflop_s"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    ridge = mm / copy  # FLOP per byte where the two ceilings meet
    ax.plot([0.1, ridge, 5000], [copy * 0.1, mm, mm], color="black", lw=1.5,
            label=f"ceilings: copy {copy} TB/s, matmul {mm:.0f} TFLOP/s")
    dec = next(r for r in k["decode"] if (r["batch"], r["context"], r["block_size"]) == (64, 4096, 16))
    flops = 4 * D * HQ * dec["batch"] * dec["context"]
    intensity = flops / dec["bytes"]
    for key, label, color in (("triton_tb_s", "decode: Triton", COLORS["triton"]),
                              ("contiguous_sdpa_tb_s", "decode: contiguous SDPA", COLORS["contiguous"]),
                              ("gather_sdpa_tb_s", "decode: gather + SDPA", COLORS["gather"]),
                              ("course_torch_tb_s", "decode: course torch path", "tab:gray")):
        ax.scatter([intensity], [dec[key] * intensity], color=color, label=label, zorder=3)
    p = k["prefill"]
    p_bytes = 2 * (p["batch"] * p["new"] * HQ * D * 2) + 2 * p["batch"] * (p["prefix"] + p["new"]) * 8 * D * 2
    ax.scatter([p["flops"] / p_bytes], [p["triton_tflop_s"]], marker="s", color=COLORS["triton"],
               label="prefill: Triton", zorder=3)
    for key, color in (("flex", COLORS["flex"]), ("sdpa", COLORS["contiguous"])):
        if "tflop_s" in p[key]:
            ax.scatter([p["flops"] / p_bytes], [p[key]["tflop_s"]], marker="s", color=color, zorder=3,
                       label=f"prefill: {'FlexAttention' if key == 'flex' else 'SDPA'}")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)", ylabel="TFLOP/s",
           title=f"{res['machine']['gpu']}: decode is memory-bound, prefill compute-bound")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_xlim(0.1, 5000)
    labels = [f"{r['batch']}x{r['context']}\nblock {r['block_size']}" for r in k["decode"]]
    xs = range(len(labels))
    width = 0.2
    for i, (key, label, color) in enumerate((("triton_tb_s", "Triton (ours)", COLORS["triton"]),
                                             ("gather_sdpa_tb_s", "gather + SDPA", COLORS["gather"]),
                                             ("flex", "FlexAttention paged", COLORS["flex"]),
                                             ("contiguous_sdpa_tb_s", "contiguous SDPA (no paging)",
                                              COLORS["contiguous"]))):
        vals = [r["flex_paged"].get("tb_s", 0) if key == "flex" else r[key] for r in k["decode"]]
        bx.bar([j + (i - 1.5) * width for j in xs], vals, width, label=label, color=color)
    bx.axhline(copy, color="black", ls="--", lw=1, label=f"device copy {copy} TB/s")
    bx.set_xticks(list(xs), labels, fontsize=7)
    bx.set(ylabel="TB/s", title="paged decode attention, bf16, 32/8 heads, d 128")
    bx.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Date": None})
    plt.close(fig)


def headline() -> str:
    """The chapter's line in the root README's results table."""
    g = load()
    dec = next(r for r in g["kernels"]["decode"] if (r["batch"], r["context"], r["block_size"]) == (64, 4096, 16))
    goal = g["engine"]["goal"]
    return (f"{g['machine']['gpu']}: paged decode 64 x 4096, bf16, {dec['triton_tb_s']} TB/s against a "
            f"{g['kernels']['ceilings']['copy_tb_s']} TB/s copy; the engine {goal['measured']} tokens/s against HF "
            f"static-cache `generate` {goal['hf_static']} ({'met' if goal['met'] else 'goal missed'})")


@course_report.register("step06", headline, BEGIN)
def render() -> course_report.Rendered:
    """The README's block and its roofline plot, for `python -m course report`."""
    res = load()
    return tables(res), {"roofline.svg": lambda path: plot(res, path)}


def readme_block(readme: str) -> str:
    return course_report.readme_block(readme, BEGIN, END)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update README.md's results block and the plot")
    args = ap.parse_args(argv)
    res = load()
    text = tables(res)
    print(text)
    if args.write:
        course_report.write_block(README, text, BEGIN, END)
        plot(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
