"""`python -m benchmarks.step06.report [--write]`: the chapter's tables and plots, from results/h200.json (kernels),
results/h200_flashinfer.json (FlashInfer beside them), results/h200_engine.json (the engine,
benchmarks/step06/engine_report.py), results/h200_cascade.json (cascade attention), results/h200_fp8.json and
results/h200_fp8_ablation.json (the FP8 cache) and results/h200_speculative.json (the verify step).

Runs on a CPU: it only reads the JSON that `python -m benchmarks.step06.kernels --part kernels --out
step06_triton/results/h200.json`, `python -m benchmarks.step06.engine --out step06_triton/results/h200_engine.json`
and `python -m benchmarks.step06.cascade --out step06_triton/results/h200_cascade.json` wrote on the GPU.
Prints the markdown that the chapter's results page (RESULTS.md) shows between its `results` markers: the kernels and
the engine. `--write` also puts it there, with the launch rule's before / after between the `split-rule` markers, and
writes the second results page (RESULTS_CASCADE_FP8.md): cascade attention, a verify step and the FP8 cache's GPU
tables between its `cascade-fp8` markers, the FP8 cache's trade-off between its `fp8` markers
(benchmarks/step06/fp8_report.py, from results/fp8.json and results/h200_fp8.json), each in whichever page of the
chapter holds its markers; and it redraws results/roofline.svg.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks import reporting
from benchmarks.reporting import met
from step06_triton.decode_attention import split_bucket, split_buckets

from . import cascade_report, compiled_report, engine_report, fp8_report, speculative_report
from .common import CHAPTER, RESULTS, command_today
from .flashinfer_anchor import goals as anchor_goals
from .flashinfer_anchor import row_key
from .kernels import GRAPH_CONTEXT

PAGE = CHAPTER / reporting.RESULTS_PAGE  # the chapter's results page, which holds the `results` block
BEGIN, END = "<!-- results:begin (python -m benchmarks.step06.report --write) -->", "<!-- results:end -->"
RULE = "<!-- split-rule:begin (python -m benchmarks.step06.report --write) -->", "<!-- split-rule:end -->"
FP8 = "<!-- fp8:begin (python -m course report --write) -->", "<!-- fp8:end -->"
MORE = "<!-- cascade-fp8:begin (python -m course report --write) -->", "<!-- cascade-fp8:end -->"  # second page's
CASCADE = "<!-- cascade:begin (python -m course report --write) -->", "<!-- cascade:end -->"  # the cascade unit's
COMPILED = "<!-- compiled:begin (python -m course report --write) -->", "<!-- compiled:end -->"  # results page's
FP8_UNIT = "<!-- fp8-accuracy:begin (python -m course report --write) -->", "<!-- fp8-accuracy:end -->"  # FP8 unit's
COLORS = {"triton": "tab:red", "gather": "tab:orange", "flex": "tab:blue", "contiguous": "tab:green"}



def load(path: Path = RESULTS / "h200.json") -> dict:
    return json.loads(path.read_text())


def load_anchor(path: Path = RESULTS / "h200_flashinfer.json") -> dict:
    """FlashInfer beside the kernels (benchmarks/step06/flashinfer_anchor.py), or {} before it ran."""
    return json.loads(path.read_text()) if path.exists() else {}


ANCHOR_MODES = {"graph": "graph", "eager": "eager", "eager_per_layer": "per layer"}  # how the anchor launched


def _anchor_modes(anchor: dict) -> list[str]:
    """The launch modes FlashInfer's run timed: graph and eager, and per layer where it planned once per step."""
    per_layer = any("flashinfer_eager_per_layer_tb_s" in r for r in anchor.get("decode", {}).values())
    return list(ANCHOR_MODES) if per_layer else ["graph", "eager"]


def _anchor(anchor: dict, row: dict, modes: list[str]) -> str:
    """A decode row's two FlashInfer cells: FlashInfer's better kernel, and the course's kernel measured in the same
    run, each as TB/s in every launch mode of `modes` (`graph / eager`, then `/ per layer`)."""
    r = anchor.get("decode", {}).get(row_key(row["heads"], row["ragged"], row["batch"], row["context"],
                                             row["block_size"]))
    if r is None:
        return "— | —"
    return " | ".join(" / ".join(str(r[f"{who}_{mode}_tb_s"]) for mode in modes) for who in ("flashinfer", "triton"))


def fastest_copy(res: dict) -> float:
    """The fastest device copy the kernel runs measured on this card, TB/s: the engine's floors are set at it."""
    k = res["kernels"]
    return max([k["ceilings"]["copy_tb_s"]] + [r["copy_tb_s"] for r in k["decode"]])


def _cell(row: dict, key: str) -> str:
    value = row.get(key)
    if isinstance(value, dict):
        value = value.get("tb_s", value.get("tflop_s"))
    return "—" if value is None else str(value)


def _captured(row: dict) -> tuple[str, str]:
    """A ragged row's two captured grids: the axis the graph runner's buckets replay for this batch (measured as
    `bucket`, or, in a file written before the buckets, the eager launch itself when the bucket is its axis), and
    one split axis sized for any context up to GRAPH_CONTEXT (the first captured version)."""
    bucket = split_bucket(split_buckets(GRAPH_CONTEXT), row["context"])
    if "triton_bucket_tb_s" in row:
        graph = f"{row['triton_bucket_tb_s']} ({row['bucket_splits']} splits)"
    else:
        graph = f"{row['triton_tb_s']} ({bucket} splits: this launch)" if bucket == row["max_splits"] else "-"
    return graph, f"{row['triton_graph_grid_tb_s']} ({row['graph_grid_splits']} splits)"


def _splits(row: dict) -> str:
    """What the launch rule gave the row's sequences: one count, or the range from the shortest to the longest."""
    lo, hi = row["splits_per_sequence"]
    return str(lo) if lo == hi else f"{lo} to {hi}"


def _flex(row: dict) -> str:
    if row["block_size"] < 16:
        return "n/a (blocks < 16)"
    return str(row["flex_paged"].get("tb_s", "did not compile (its KV tile > a block; error in the JSON)"))


def tables(res: dict, anchor: dict) -> str:
    k = res["kernels"]
    m = k.get("machine", res["machine"])
    uniform = [r for r in k["decode"] if not r["ragged"]]
    ragged = [r for r in k["decode"] if r["ragged"]]
    modes = _anchor_modes(anchor)
    heading = " / ".join(ANCHOR_MODES[m] for m in modes)
    lines = [f"Measured on {m['gpu']} ({m['sms']} SMs), torch {m['torch']}, Triton {m['triton']}, on {m['date']}. "
             f"Ceilings: device copy {fastest_copy(res)} TB/s, the fastest copy this run measured (bytes read + "
             f"written), and bf16 matmul {k['ceilings']['matmul_tflop_s']} TFLOP/s. *copy* in the tables is a copy of "
             "the row's own bytes in one launch, a probe that reads lower on small or noisy transfers, not a "
             f"ceiling. Command: `{command_today(k['command'])}` (on the GPU machine).", "",
             "**Decode attention, uniform batches**, bf16, 32 query / 8 KV heads, head_dim 128, TB/s (K/V and q "
             "read, output written); *splits*: what the launch rule gives each sequence; *first version*: the kernel "
             "before its launch rule split by work, measured on the same machine on 2026-12-01:", "",
             "| batch x context | block | splits | Triton (ours) | first version | gather + SDPA | course torch "
             f"path | FlexAttention paged | contiguous SDPA (no paging) | copy | FlashInfer, {heading} | ours "
             f"in FlashInfer's run, {heading} |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in uniform:
        lines.append(f"| {r['batch']} x {r['context']} | {r['block_size']} | {_splits(r)} | "
                     f"**{r['triton_tb_s']}** | {r['first_version_tb_s']} | {r['gather_sdpa_tb_s']} | "
                     f"{_cell(r, 'course_torch_tb_s')} | {_flex(r)} | {r['contiguous_sdpa_tb_s']} | {r['copy_tb_s']} | "
                     f"{_anchor(anchor, r, modes)} |")
    lines += ["", f"**Decode attention, the batch an engine runs**: {ragged[0]['batch']} contexts drawn uniformly "
              f"from 1..{k['ragged']['max_context']} ({ragged[0]['total_tokens']} tokens in all), blocks scattered "
              "over a pool twice the size needed, bf16, TB/s; the baselines pad the batch to its longest context (a "
              "key mask hides the padding) and are charged for the real bytes only:", "",
              "| heads (query / KV x head_dim) | block | splits per sequence | Triton (ours) | as a captured step "
              f"replays it | one split axis for {GRAPH_CONTEXT // 1024}k contexts | first version's rule | gather + "
              f"SDPA | FlexAttention paged | contiguous SDPA (padded) | copy | FlashInfer, {heading} | ours in "
              f"FlashInfer's run, {heading} |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ragged:
        lines.append(f"| {r['heads']} | {r['block_size']} | {_splits(r)} | **{r['triton_tb_s']}** | "
                     f"{' | '.join(_captured(r))} | "
                     f"{r['triton_first_rule_tb_s']} ({r['first_rule_splits']} per sequence) | "
                     f"{r['gather_sdpa_tb_s']} | {_flex(r)} | {r['contiguous_sdpa_tb_s']} | {r['copy_tb_s']} | "
                     f"{_anchor(anchor, r, modes)} |")
    lines += ["", "**Prefill with a cached prefix** (32 / 8 heads, head_dim 128, block 16), TFLOP/s over the visible "
              "query-key pairs:", "", "| batch | cached prefix | new tokens | Triton (ours) | FlexAttention | SDPA "
              "(contiguous, causal bottom-right) | FlashInfer | ours in FlashInfer's run |",
              "|---|---|---|---|---|---|---|---|"]
    for p, fi in ((k["prefill"], anchor.get("prefill", {}).get("uniform")),
                  (k["ragged_prefill"], anchor.get("prefill", {}).get("ragged"))):
        span = (lambda xs: str(xs[0]) if len(set(xs)) == 1 else f"{min(xs)}..{max(xs)}")  # noqa: E731
        sdpa = p["sdpa"].get("tflop_s", "— (one mask shape per batch)" if "error" in p["sdpa"] else "—")
        fi_cells = "— | —" if fi is None else f"{fi['flashinfer_tflop_s']} | {fi['triton_tflop_s']}"
        lines.append(f"| {p['batch']} | {span(p['prefixes'])} | {span(p['news'])} | **{p['triton_tflop_s']}** | "
                     f"{p['flex'].get('tflop_s', p['flex'].get('error'))} | {sdpa} | {fi_cells} |")
    s_ = k["store"]
    lines += ["", f"**store_kvcache** ({s_['tokens']} tokens into random slots): Triton **{s_['triton_gb_s']} GB/s**, "
              f"torch index_put {s_['torch_index_put_gb_s']} GB/s.", "", "| target | measured | |", "|---|---|---|"]
    lines += [f"| {g['goal']} | {g['measured']} | {met(g['met'])} |"
              for g in k["goals"] + (anchor_goals(anchor) if anchor else [])]  # FlashInfer's judged on its data
    if anchor:
        lines += ["", f"FlashInfer {anchor['flashinfer']} (JIT-compiled on the GPU machine) on the same tensors: "
                  f"`{anchor['commands'][-1]}`, on {anchor['machine']['date']}. Its columns give its better decode "
                  "kernel (CUDA cores or tensor cores, both in the JSON) and, beside it, the course's kernel timed in "
                  "the same run; *eager* launches include FlashInfer's planning on the host"
                  + ("; *per layer*: as an engine runs a step, one plan and then a model's layers of calls (16 for "
                     "32 / 8 x 128 heads, 30 for 9 / 3 x 64), the time over the layers." if len(modes) > 2
                     else ".")]
    return "\n".join(lines) + "\n"


def plot(res: dict, out: Path = RESULTS / "roofline.svg") -> None:
    """Left: the roofline (achieved TFLOP/s against FLOP per byte, under the copy and matmul ceilings).
    Right: decode TB/s per batch and block size, uniform and ragged, against a copy of the same bytes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "kvcourse"  # deterministic ids in the SVG
    k = res["kernels"]
    copy, mm = fastest_copy(res), k["ceilings"]["matmul_tflop_s"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw=dict(width_ratios=[1, 1.4]))
    ridge = mm / copy  # FLOP per byte where the two ceilings meet
    ax.plot([0.1, ridge, 5000], [copy * 0.1, mm, mm], color="black", lw=1.5,
            label=f"ceilings: copy {copy} TB/s, matmul {mm:.0f} TFLOP/s")
    main = next(r for r in k["decode"] if (r["ragged"], r["batch"], r["context"], r["block_size"]) ==
                (False, 64, 4096, 16))
    ragged = [r for r in k["decode"] if r["ragged"] and r["block_size"] == 16]
    for r, marker, what in [(main, "o", "64x4096")] + [(r, "^", f"ragged {r['heads']}") for r in ragged]:
        intensity = r["hq"] / r["hkv"]  # FLOP per byte of K/V in bf16: the GQA group size
        for key, label, color in (("triton_tb_s", "Triton", COLORS["triton"]),
                                  ("contiguous_sdpa_tb_s", "contiguous SDPA", COLORS["contiguous"]),
                                  ("gather_sdpa_tb_s", "gather + SDPA", COLORS["gather"])):
            ax.scatter([intensity], [r[key] * intensity], color=color, marker=marker, zorder=3,
                       label=f"decode {what}: {label}")
    for p, marker, what in ((k["prefill"], "s", "4x(4096+2048)"), (k["ragged_prefill"], "D", "ragged")):
        hq, hkv, d = 32, 8, 128
        context = sum(a + b for a, b in zip(p["prefixes"], p["news"]))
        p_bytes = 2 * sum(p["news"]) * hq * d * 2 + 2 * context * hkv * d * 2  # q read, out written; K, V read
        x = p["flops"] / p_bytes
        ax.scatter([x], [p["triton_tflop_s"]], marker=marker, color=COLORS["triton"], zorder=3,
                   label=f"prefill {what}: Triton")
        if "tflop_s" in p["flex"]:
            ax.scatter([x], [p["flex"]["tflop_s"]], marker=marker, color=COLORS["flex"], zorder=3,
                       label=f"prefill {what}: FlexAttention")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)", ylabel="TFLOP/s",
           title=f"{res['machine']['gpu']}: decode is memory-bound, prefill compute-bound")
    ax.legend(fontsize=6, loc="lower right")
    ax.set_xlim(0.1, 5000)
    rows = k["decode"]
    labels = [(f"ragged\n{r['heads']}" if r["ragged"] else f"{r['batch']}x{r['context']}")
              + f"\nblock {r['block_size']}" for r in rows]
    xs = range(len(rows))
    width = 0.2
    for i, (key, label, color) in enumerate((("triton_tb_s", "Triton (ours)", COLORS["triton"]),
                                             ("gather_sdpa_tb_s", "gather + SDPA", COLORS["gather"]),
                                             ("flex", "FlexAttention paged", COLORS["flex"]),
                                             ("contiguous_sdpa_tb_s", "contiguous SDPA (ragged: padded)",
                                              COLORS["contiguous"]))):
        vals = [r["flex_paged"].get("tb_s", 0) if key == "flex" else r[key] for r in rows]
        bx.bar([j + (i - 1.5) * width for j in xs], vals, width, label=label, color=color)
    bx.scatter([j - 1.5 * width for j in xs], [r.get("triton_first_rule_tb_s", r.get("first_version_tb_s"))
                                              for r in rows], marker="_", s=120, color="black", zorder=3,
               label="ours before: first version (uniform), first rule (ragged)")
    bx.scatter(list(xs), [r["copy_tb_s"] for r in rows], marker="*", color="black", zorder=3,
               label="device copy of the same bytes")
    bx.set_xticks(list(xs), labels, fontsize=6)
    bx.set(ylabel="TB/s", title="paged decode attention, bf16 (uniform rows: 32/8 heads, d 128)",
           ylim=(0, 1.35 * max(max(r["copy_tb_s"], r["triton_tb_s"]) for r in rows)))
    bx.legend(fontsize=6, loc="upper center", ncol=3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Date": None})
    plt.close(fig)


def split_rule(res: dict) -> str:
    """The Theory's before / after of the decode launch rule, from the same JSON as the tables."""
    k = res["kernels"]
    rag = {r["heads"]: r for r in k["decode"] if r["ragged"] and r["block_size"] == 16}
    (l_name, lm), (s_name, sm) = rag.items()
    main = next(r for r in k["decode"] if (r["ragged"], r["batch"], r["context"], r["block_size"]) ==
                (False, 64, 4096, 16))
    lo, hi = main["splits_per_sequence"]
    return (f"Measured on the {k['machine']['gpu']} (this page's tables), on the ragged batch: the first "
            f"version's rule ({lm['first_rule_splits']} and {sm['first_rule_splits']} splits per sequence) moves "
            f"{lm['triton_first_rule_tb_s']} TB/s with {l_name} heads and {sm['triton_first_rule_tb_s']} with "
            f"{s_name}; cutting by work ({_splits(lm)} splits per sequence with {l_name} heads, {_splits(sm)} with "
            f"{s_name}) moves **{lm['triton_tb_s']}** and **{sm['triton_tb_s']}** TB/s, against the run's ceiling of "
            f"{fastest_copy(res)} TB/s (its fastest device copy). A CUDA graph replays this batch on "
            f"{_captured(lm)[0]} and {_captured(sm)[0]} TB/s; on one split axis sized for contexts up to "
            f"{GRAPH_CONTEXT // 1024}k tokens "
            f"(the unused programs returning at once) it moved {_captured(lm)[1]} and {_captured(sm)[1]}. The "
            f"uniform 64 x 4096 batch is near-uniform: {lo if lo == hi else f'{lo} to {hi}'} split per sequence, "
            f"{main['triton_tb_s']} TB/s, where the first version moved {main['first_version_tb_s']}.\n")


def headline() -> str:
    """The chapter's line in the root README's results table."""
    g, e = load(), engine_report.load()
    dec = next(r for r in g["kernels"]["decode"] if (r["batch"], r["context"], r["block_size"]) == (64, 4096, 16))
    rag = next(r for r in g["kernels"]["decode"] if r["ragged"] and r["block_size"] == 16)
    rand = e["smollm2_135m"]["random"]
    return (f"{g['machine']['gpu']}: paged decode 64 x 4096, bf16, {dec['triton_tb_s']} TB/s, "
            f"{dec['triton_tb_s'] / dec['contiguous_sdpa_tb_s']:.0%} of SDPA on the same K/V unpaged "
            f"({dec['contiguous_sdpa_tb_s']}); a ragged batch {rag['triton_tb_s']} against padded SDPA's "
            f"{rag['contiguous_sdpa_tb_s']}; the overlapped engine "
            f"{rand['engine_overlap']['tokens_per_s']} tokens/s, {rand['engine_overlap']['ratio_vs_hf_static']}x HF "
            "static-cache `generate` (SmolLM2's shape)")


def block(res: dict, engine: dict) -> str:
    """The results page's block: the kernels' tables, then the engine's."""
    return tables(res, load_anchor()) + "\n" + engine_report.tables(engine, fastest_copy(res)) + "\n"


def more() -> str:
    """The second results page's block (one page would not be read in a sitting): cascade attention's tables, a
    verify step's, the FP8 cache's on the GPU."""
    cascade = cascade_report.tables(cascade_report.load())
    verify = speculative_report.tables(speculative_report.load())
    fp8 = fp8_report.tables(fp8_report.load_gpu(), fp8_report.load_ablation())
    return cascade + "\n" + verify + "\n" + fp8 + "\n"


def compiled_section() -> str:
    """The compiled runner beside the hand-fused one, from the newest committed <card>_compiled.json; until one is
    committed, the command that makes it."""
    run = compiled_report.load()
    if run is None:
        return ("No GPU run of the compiled runner (`compiled_runner.py`) is committed: it is measured by `python -m "
                "benchmarks.step06.compiled --out step06_triton/results/h200_compiled.json` on a GPU, then `python -m "
                "course report --write` puts it here.\n")
    return compiled_report.tables(run)


def sections() -> dict[tuple[str, str], str]:
    """The chapter's other measured blocks: the launch rule's before / after (results page), the second results
    page's tables and the FP8 cache's trade-off, the cascade and FP8 units' one table each."""
    return {RULE: split_rule(load()), MORE: more(), COMPILED: compiled_section(),
            FP8: fp8_report.section(fp8_report.load_accuracy(), fp8_report.load_gpu()),
            CASCADE: cascade_report.unit(cascade_report.load()), FP8_UNIT: fp8_report.unit(fp8_report.load_accuracy())}


@reporting.register("step06", headline, BEGIN, sections)
def render() -> reporting.Rendered:
    """The results page's block, its roofline plot and the engine's timeline, for `python -m course report`."""
    res, engine, run = load(), engine_report.load(), compiled_report.load()
    drawn = {"roofline.svg": lambda path: plot(res, path),
             "timeline.svg": lambda path: engine_report.plot_timeline(engine, path)}
    if run is not None:
        drawn[compiled_report.FIGURE] = lambda path: compiled_report.draw(run, path)
    return block(res, engine), drawn


def readme_block(readme: str) -> str:
    return reporting.readme_block(readme, BEGIN, END)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update the chapter's results blocks and the plots")
    args = ap.parse_args(argv)
    res, engine = load(), engine_report.load()
    text = block(res, engine)
    print(text)
    if args.write:
        reporting.write_block(reporting.page_with(CHAPTER, BEGIN), text, BEGIN, END)
        for markers, section in sections().items():
            reporting.write_block(reporting.page_with(CHAPTER, markers[0]), section, *markers)
        plot(res)
        engine_report.plot_timeline(engine, RESULTS / "timeline.svg")
        if (run := compiled_report.load()) is not None:
            compiled_report.draw(run, RESULTS / compiled_report.FIGURE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
