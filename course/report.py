"""`python -m course report [--write] [CHAPTER ...]`: every chapter's measured results, drawn from its data.

`make bench` leaves one JSON per run in each chapter's `results/` folder (see course/results.py). This module
turns those files into the markdown tables each README shows between its `results` markers, and into the
plots beside them (`results/*.svg`). Without `--write` it prints the markdown; with it, it rewrites the
READMEs' blocks and redraws the plots. Nothing here measures: rerun `make bench` for new numbers.

Which baseline each ratio uses is said next to it: Hugging Face always runs with its default attention
(SDPA); for throughput it is `generate` with all requests in one left-padded batch.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from . import results
from .paths import REPO_ROOT

BEGIN = "<!-- results:begin (python -m course report --write) -->"
END = "<!-- results:end -->"
WORKLOADS = ("short", "long", "shared_prefix", "diverge")
DESIGNS = {"step03": "hash (ch. 3, 16-token blocks)", "step04": "radix (ch. 4, 1-token slots)",
           "step05": "bridge (ch. 5, 16-token blocks)"}
COLORS = {"off": "tab:gray", "on": "tab:red", "hf": "tab:blue", "recipe": "tab:cyan", "step03": "tab:orange",
          "step04": "tab:green", "step05": "tab:red", "contiguous": "tab:gray"}


class MissingResults(Exception):
    """A chapter's results/*.json are not there yet: run `make bench` (or the command named)."""


def need(chapter: str, name: str) -> dict:
    record = results.load(chapter, name)
    if record is None:
        raise MissingResults(f"{results.results_path(chapter, name).relative_to(REPO_ROOT)} is missing: run "
                             f"`make bench` (or its line for {chapter})")
    return record


def provenance(records: list[dict], model: str = "SmolLM2-135M-Instruct") -> str:
    """One line per distinct machine: what, when, how loaded, and the commands that wrote the files."""
    m = records[0]["machine"]
    dates = sorted({r["date"][:10] for r in records})
    loads = [r["machine"]["load_avg_1m_at_start"] for r in records] + \
        [r["machine"].get("load_avg_1m_at_end", 0) for r in records]
    many = len(records) > 1
    forms = dict.fromkeys(r["command"].replace(f"--workload {r['workload']}", "--workload W" if many else
                                               f"--workload {r['workload']}") for r in records)
    commands = ", ".join(f"`{c}`" for c in forms)
    if many and any("--workload W" in c for c in forms):
        commands += " for W in " + ", ".join(f"`{r['workload']}`" for r in records if "--workload" in r["command"])
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    spread = f"{min(loads)}" if min(loads) == max(loads) else f"{min(loads)}-{max(loads)}"
    return (f"Measured on {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch threads), torch {m['torch']}, "
            f"transformers {m['transformers']}, fp32, {model}, greedy, on {when}; 1-minute load "
            f"average {spread} at the start and end of the runs (a bench's own {m['torch_threads']} "
            "threads count; more means another job shared the cores). "
            f"Written by {commands}; `python -m course report --write` drew this block.")


def fmt(x, digits: int = 4) -> str:
    """A table cell: booleans as yes / **no** (a failed check stands out), floats to `digits` digits."""
    if isinstance(x, bool):
        return "yes" if x else "**no**"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"  # significant digits, or whole thousands
    return f"{x:,}" if isinstance(x, int) else str(x)


def table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]


# ---- plots ---------------------------------------------------------------------------------------------------

def _plt():
    """pyplot, without choosing a backend: a script gets a headless one, a notebook keeps its inline one."""
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "kvcourse"  # deterministic ids, so a redraw of the same data diffs clean
    return plt


def save_svg(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None})
    _plt().close(fig)


def plot_decode_cost(rec: dict):
    """Chapter 1: one decode step's cost against the context: recomputing grows, reading the cache stays flat."""
    plt = _plt()
    rows = rec["figures"]["decode_step_ms"]
    ctx = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for key, label, color in (("cache_off", "no cache: recompute all n tokens", COLORS["off"]),
                              ("cache_on", "KV cache (ours): one token, read n cached K/V", COLORS["on"]),
                              ("hf_cache_on", "Hugging Face, DynamicCache, SDPA", COLORS["hf"])):
        ax.plot(ctx, [r[key] for r in rows], "o-", label=label, color=color)
    ax.set(xlabel="context length n (tokens)", ylabel="ms per decode step",
           title="One decode step, batch 1, SmolLM2-135M on the CPU")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_throughput_and_memory(rec: dict):
    """Chapter 2: tokens/s of the contenders, and the KV memory held at every engine step."""
    plt = _plt()
    f = rec["figures"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8))
    names = ["paged engine\n(all at once)", "HF generate\nbatched, padded", "HF generate\none by one",
             "chapter 1\none by one"]
    vals = [f["tokens_per_s"], f["hf_batched_tokens_per_s"], f["hf_tokens_per_s"], f["step01_tokens_per_s"]]
    ax.bar(names, vals, color=[COLORS["on"], COLORS["hf"], COLORS["recipe"], COLORS["off"]])
    ax.set(ylabel="generated tokens / s", title=f"{f['requests']} ragged requests ({f['workload']})")
    ax.tick_params(axis="x", labelsize=8)
    mem = f["kv_mib_per_step"]
    for key, label, color in (("paged", "paged pool: blocks held", COLORS["on"]),
                              ("contiguous", "contiguous: prompt + max_new per request", COLORS["contiguous"]),
                              ("hf_batched", "HF padded batch: every row as long as the longest", COLORS["hf"])):
        bx.plot(range(1, len(mem[key]) + 1), mem[key], label=label, color=color)
    bx.set(xlabel="step", ylabel="KV cache held (MiB)", title="KV memory per step, same requests")
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_ttft(chapter: str, recs: dict[str, dict]):
    """Chapters 3-5: time to first token, cold and warm, our cache off and on, next to Hugging Face's two."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(recs), figsize=(3.1 * len(recs), 3.8), squeeze=False)
    bars = (("ttft_cold_off_s", "cold, cache off", COLORS["off"], ""),
            ("ttft_cold_on_s", "cold, cache on", COLORS["on"], ""),
            ("hf_ttft_cold_s", "cold, HF", COLORS["hf"], ""),
            ("ttft_off_warm_median_s", "warm, cache off", COLORS["off"], "//"),
            ("ttft_on_warm_median_s", "warm, cache on", COLORS["on"], "//"),
            ("hf_nocache_ttft_warm_median_s", "warm, HF no cache", COLORS["hf"], "//"),
            ("hf_recipe_ttft_warm_median_s", "warm, HF prompt-cache recipe", COLORS["recipe"], "//"))
    from matplotlib.ticker import FormatStrFormatter

    for ax, (name, rec) in zip(axes[0], recs.items()):
        f = rec["figures"]
        values = [f[key] * 1e3 for key, *_ in bars]
        for i, (value, (_, label, color, hatch)) in enumerate(zip(values, bars)):
            ax.bar(i, value, color=color, hatch=hatch, edgecolor="black", lw=0.4, label=label)
        # log scale, with room below the smallest bar so that every bar shows its height
        ax.set(yscale="log", title=name, xticks=[], ylim=(min(values) / 2, max(values) * 1.5))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter(""))
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("time to first token (ms, log)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(f"{chapter}: TTFT per workload (warm = median over the requests after the first)", fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def plot_hit_rates(by_chapter: dict[str, dict[str, dict]]):
    """Hit rate of each design on each workload (cached prompt tokens / prompt tokens, over every round)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.6, 3.9))
    width = 0.8 / len(by_chapter)
    for i, (chapter, recs) in enumerate(by_chapter.items()):
        xs = [j + (i - (len(by_chapter) - 1) / 2) * width for j in range(len(WORKLOADS))]
        ax.bar(xs, [recs[w]["figures"]["hit_rate"] for w in WORKLOADS], width, label=DESIGNS[chapter],
               color=COLORS[chapter])
    ax.set_xticks(range(len(WORKLOADS)), WORKLOADS)
    ax.set(ylabel="hit rate (cached / prompt tokens)", ylim=(0, 1), title="Prompt tokens reused, per design")
    ax.legend(fontsize=8, ncol=len(by_chapter), loc="upper center", bbox_to_anchor=(0.5, -0.1))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_block_sizes(rec: dict):
    """Chapter 5: per workload, the bridge's and the hash's hit rate as the block shrinks toward chapter 4's
    one-token slots (the star). The two designs sit on the same points: granularity decides the hits."""
    plt = _plt()
    f = rec["figures"]
    sizes = sorted(f["block_sizes"], reverse=True)
    fig, axes = plt.subplots(1, len(f["designs"]), figsize=(2.9 * len(f["designs"]), 3.3), squeeze=False)
    for ax, row in zip(axes[0], f["designs"]):
        rate = lambda design, row=row: row[design]["cached_tokens"] / row["prompt_tokens"]  # noqa: E731
        xs = [str(b) for b in sizes]
        ax.plot(xs, [rate(f"hash bs={b}") for b in sizes], "s-", ms=9, mfc="none", color=COLORS["step03"],
                label="hash (ch. 3)")
        ax.plot(xs, [rate(f"bridge bs={b}") for b in sizes], "o-", color=COLORS["step05"], label="bridge (ch. 5)")
        ax.plot([xs[-1]], [rate("radix (ch. 4)")], "*", ms=14, color=COLORS["step04"], label="radix (ch. 4)")
        ax.set(title=row["workload"], xlabel="block size (tokens)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("hit rate (cached / prompt tokens)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Reuse against block size, same requests, no model", fontsize=10)
    fig.tight_layout()
    return fig


# ---- the READMEs' blocks --------------------------------------------------------------------------------------
Rendered = tuple[str, dict[str, Callable]]  # markdown, {plot file name: figure builder}


def step01() -> Rendered:
    rec = need("step01", "single")
    f = rec["figures"]
    lines = [provenance([rec]), "",
             f"**Decode speed at batch 1** ({f['prompt_tokens']}-token prompt, {f['new_tokens']} new tokens, best of "
             "3 interleaved rounds). Hugging Face is `generate` with its default attention, SDPA.", ""]
    lines += table(["cache on (tokens/s)", "cache off", "HF generate", "cache on / off", "ours / HF",
                    "same tokens (on, off, HF)"],
                   [[f["tokens_per_s_cache_on"], f["tokens_per_s_cache_off"], f["hf_tokens_per_s"],
                     f"{f['speedup_cache']}x", f"{f['speedup_vs_hf']}x", f["outputs_identical"]]])
    lines += ["", "**One decode step against the context length** (best of 3; random token ids):", "",
              "![decode cost against context length](results/decode_cost.svg)", ""]
    lines += table(["context", "cache on (ms)", "cache off (ms)", "HF, cache (ms)", "off / on"],
                   [[r["context"], r["cache_on"], r["cache_off"], r["hf_cache_on"],
                     f"{r['cache_off'] / r['cache_on']:.1f}x"] for r in f["decode_step_ms"]])
    return "\n".join(lines) + "\n", {"decode_cost.svg": lambda: plot_decode_cost(rec)}


def step02() -> Rendered:
    rec = need("step02", "batch")
    f = rec["figures"]
    lines = [provenance([rec]), "",
             f"**Throughput**: the `{f['workload']}` workload, {f['requests']} ragged requests "
             f"({f['prompt_tokens']} prompt tokens, {f['new_tokens']} generated, greedy, stopping at end of turn), "
             "best of 3 interleaved rounds. Every contender is credited with each request's own tokens only. "
             "Hugging Face uses SDPA; its fair baseline is the batched call.", "",
             "![throughput and KV memory per step](results/throughput_memory.svg)", ""]
    lines += table(["contender", "tokens/s", "engine's speed-up over it"],
                   [["paged engine, continuous batching", f["tokens_per_s"], "-"],
                    ["HF `generate`, all requests in one left-padded batch", f["hf_batched_tokens_per_s"],
                     f"{f['speedup_vs_hf_batched']}x"],
                    ["HF `generate`, one request at a time", f["hf_tokens_per_s"], f"{f['speedup_vs_hf']}x"],
                    ["chapter 1's `generate`, one at a time", f["step01_tokens_per_s"], f"{f['speedup_vs_step01']}x"]])
    mem = f["kv_mib_per_step"]
    lines += ["", f"Same tokens as HF one by one and chapter 1: {fmt(f['outputs_identical'])}; as HF's padded batch: "
              f"{fmt(f['hf_batched_outputs_identical'])} (padding changes fp32 sums slightly, so a near-tie may flip).",
              "", "**KV memory** over the engine's {} steps:".format(f["steps"]), ""]
    lines += table(["", "peak (MiB)", "allocated but unfilled"],
                   [["paged pool (blocks of 16)", max(mem["paged"]), f"{f['kv_waste_fraction']:.1%}"],
                    ["contiguous buffers, prompt + max_new_tokens each", max(mem["contiguous"]),
                     f"{f['contiguous_waste_fraction']:.1%}"],
                    ["HF's padded batch", max(mem["hf_batched"]), "-"]])
    return "\n".join(lines) + "\n", {"throughput_memory.svg": lambda: plot_throughput_and_memory(rec)}


def prefix_records(chapter: str) -> dict[str, dict]:
    return {w: need(chapter, w) for w in WORKLOADS}


def step_prefix(chapter: str) -> Rendered:
    """Chapters 3, 4 and 5 share one table: the same bench, the same workloads, the same baselines."""
    recs = prefix_records(chapter)
    lines = [provenance(list(recs.values())), "",
             "Every workload runs sequentially through the engine with the cache off and on, then through Hugging "
             "Face `generate` (SDPA) without a cache and with its prompt-cache recipe (the prefix all requests "
             "share, prefilled once and deep-copied per request), all in one process. *Cold* is the first "
             "request, one sample, so it moves from run to run more than *warm*, the median of the rest.", "",
             "![time to first token per workload](results/ttft.svg)", ""]
    rows = []
    for w, rec in recs.items():
        f = rec["figures"]
        pair = lambda a, b, f=f: f"{f[a]:.3g} / {f[b]:.3g}"  # noqa: E731
        rows.append([f"`{w}`", f"{f['hit_rate']:.3f}", pair("ttft_cold_off_s", "ttft_cold_on_s"),
                     f"{f['hf_ttft_cold_s']:.3g}", pair("ttft_off_warm_median_s", "ttft_on_warm_median_s"),
                     pair("hf_nocache_ttft_warm_median_s", "hf_recipe_ttft_warm_median_s"),
                     f"{f['speedup_warm']}x (bound {f['speedup_bound']}x)", f"{f['warm_ttft_vs_hf_recipe']}x",
                     f"{f['kv_peak_bytes_off'] / 2**20:.0f} / {f['kv_peak_bytes_on'] / 2**20:.0f}",
                     f["outputs_identical"] and f["hf_first_tokens_match"]])
    lines += table(["workload", "hit rate", "cold TTFT off / on (s)", "cold, HF (s)", "warm TTFT off / on (s)",
                    "warm, HF no cache / recipe (s)", "warm on vs off", "warm vs HF recipe", "KV peak off / on (MiB)",
                    "same tokens"], rows)
    lines += ["", "*warm on vs off* is our engine against itself; *warm vs HF recipe* is the recipe's warm TTFT "
              "over ours (above 1: ours is faster). *same tokens*: cache on = cache off, and HF's first tokens = ours."]
    plots = {"ttft.svg": lambda: plot_ttft(chapter, recs)}
    return "\n".join(lines) + "\n", plots


def step03() -> Rendered:
    text, plots = step_prefix("step03")
    f = need("step03", "long")["figures"]
    text += (f"\nHashing a prompt into its chain of SHA-256 block hashes costs {f['hash_us_per_token']} µs per token "
             f"(Python's built-in `hash` of the same tuples: {f['hash_builtin_us_per_token']} µs); looking up an "
             f"already hashed 2k-token prompt takes {f['lookup_2k_ms']} ms.\n")
    return text, plots


def step04() -> Rendered:
    text, plots = step_prefix("step04")
    by = {c: prefix_records(c) for c in ("step03", "step04")}
    f = need("step04", "long")["figures"]
    text += ("\n**Hash against radix**, the same requests (chapter 3's block hash at 16 tokens, this chapter's tree "
             "at 1):\n\n![hit rate per design](results/hit_rate.svg)\n\n")
    text += "\n".join(table(["workload", "prompt tokens", "cached: hash", "cached: radix"],
                            [[f"`{w}`", by["step04"][w]["figures"]["prompt_tokens"],
                              by["step03"][w]["figures"]["cached_tokens"], by["step04"][w]["figures"]["cached_tokens"]]
                             for w in WORKLOADS]))
    text += (f"\n\nThe tree's own work for one request of `long`'s shape ({f['bookkeeping_tokens']} tokens: "
             f"match, lock, insert, unlock): median {f['bookkeeping_us_median']} µs (match "
             f"{f['bookkeeping_match_us']}, lock {f['bookkeeping_lock_us']}, insert {f['bookkeeping_insert_us']}, "
             f"unlock {f['bookkeeping_unlock_us']}).\n")
    plots["hit_rate.svg"] = lambda: plot_hit_rates(by)
    return text, plots


def step05() -> Rendered:
    text, plots = step_prefix("step05")
    by = {c: prefix_records(c) for c in ("step03", "step04", "step05")}
    d = need("step05", "designs")
    rows = d["figures"]["designs"]
    names = [k for k in rows[0] if k not in ("workload", "prompt_tokens")]
    text += ("\n**The three designs**, same requests, hit rate as the engines measured it above:\n\n"
             "![hit rate per design](results/hit_rate.svg)\n\n"
             "**Block size**, without the model: prompt tokens each design reuses on every workload, and the "
             "cache manager's bookkeeping per warm request in µs (admit, publish or insert, free). "
             + provenance([d], "a 1-layer toy model with SmolLM2's vocabulary") + "\n\n"
             "![hit rate against block size](results/block_size.svg)\n\n")
    text += "\n".join(table(["design"] + [f"`{r['workload']}` cached / µs" for r in rows],
                            [[n] + [f"{r[n]['cached_tokens']} / {r[n]['bookkeeping_us']}" for r in rows]
                             for n in names])) + "\n"
    plots["hit_rate.svg"] = lambda: plot_hit_rates(by)
    plots["block_size.svg"] = lambda: plot_block_sizes(d)
    return text, plots


def overview() -> str:
    """The root README's table: one headline per chapter, each from the same files as the chapter's block."""
    one = need("step01", "single")["figures"]
    big = one["decode_step_ms"][-1]
    two = need("step02", "batch")["figures"]
    p3, p4 = prefix_records("step03"), prefix_records("step04")
    long3, long5 = p3["long"]["figures"], need("step05", "long")["figures"]
    d3, d4 = p3["diverge"]["figures"], p4["diverge"]["figures"]
    designs = {r["workload"]: r for r in need("step05", "designs")["figures"]["designs"]}
    dl = designs["long"]
    from step06_triton import report as gpu

    g = gpu.load()
    dec = next(r for r in g["kernels"]["decode"] if (r["batch"], r["context"], r["block_size"]) == (64, 4096, 16))
    goal = g["engine"]["goal"]
    rows = [
        ["1", "[results](step01_kvcache/README.md#measured-here)",
         f"one decode step at {big['context']} tokens of context: {big['cache_on']} ms with the cache, "
         f"{big['cache_off']} ms recomputing; decode {one['speedup_vs_hf']}x Hugging Face `generate` (SDPA), "
         f"same tokens: {fmt(one['outputs_identical'])}"],
        ["2", "[results](step02_paged/README.md#measured-here)",
         f"{two['requests']} ragged requests: continuous batching {two['speedup_vs_hf_batched']}x HF `generate` "
         f"batched (SDPA), {two['speedup_vs_hf']}x HF one by one; unfilled KV {two['kv_waste_fraction']:.1%} paged "
         f"vs {two['contiguous_waste_fraction']:.1%} contiguous"],
        ["3", "[results](step03_prefix_hash/README.md#measured-here)",
         f"`long`: hit rate {long3['hit_rate']:.3f}, warm TTFT {long3['ttft_off_warm_median_s']:.3g} s → "
         f"{long3['ttft_on_warm_median_s']:.3g} s ({long3['speedup_warm']}x, bound {long3['speedup_bound']}x); HF's "
         f"prompt-cache recipe / ours {long3['warm_ttft_vs_hf_recipe']}x"],
        ["4", "[results](step04_radix/README.md#measured-here)",
         f"`diverge`: the token tree reuses {d4['cached_tokens']} prompt tokens where chapter 3's 16-token hash "
         f"reuses {d3['cached_tokens']}; `long` warm TTFT {p4['long']['figures']['speedup_warm']}x"],
        ["5", "[results](step05_bridge/README.md#measured-here)",
         f"the bridge reuses what the hash reuses at the same block size (`long`, 16: "
         f"{dl['bridge bs=16']['cached_tokens']} vs {dl['hash bs=16']['cached_tokens']} tokens) and chapter 4's at "
         f"block size 1; `long` warm TTFT {long5['speedup_warm']}x"],
        ["6", "[results](step06_triton/README.md#measured-here)",
         f"{g['machine']['gpu']}: paged decode 64 x 4096, bf16, {dec['triton_tb_s']} TB/s against a "
         f"{g['kernels']['ceilings']['copy_tb_s']} TB/s copy; the engine {goal['measured']} tokens/s against HF "
         f"static-cache `generate` {goal['hf_static']} ({'met' if goal['met'] else 'goal missed'})"],
    ]
    return "\n".join(["Every figure below is drawn from the chapters' `results/*.json` by `python -m course "
                      "report --write`; `make bench` (CPU, chapters 1-5) and chapter 6's GPU command write them. "
                      "Each chapter's block says on which machine, when, and under what load.", ""]
                     + table(["chapter", "tables and plots", "headline"], rows)) + "\n"


CHAPTERS: dict[str, Callable[[], Rendered]] = {"step01": step01, "step02": step02, "step03": step03,
                                                "step04": step04, "step05": step05}


# ---- writing ---------------------------------------------------------------------------------------------------
def _block(begin: str, end: str) -> re.Pattern:
    return re.compile(re.escape(begin) + r"\n(.*?)" + re.escape(end), re.S)


def readme_block(readme: str, begin: str = BEGIN, end: str = END) -> str:
    """The text between a README's results markers (a ValueError names the markers if they are gone)."""
    match = _block(begin, end).search(readme)
    if not match:
        raise ValueError(f"no {begin} ... {end} block")
    return match.group(1)


def write_block(path: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    readme = path.read_text()
    readme_block(readme, begin, end)  # fails loudly if the markers are gone
    path.write_text(_block(begin, end).sub(lambda _: f"{begin}\n{text}{end}", readme))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m course report", description=__doc__.splitlines()[0])
    p.add_argument("chapters", nargs="*", help=f"default: all of {', '.join(CHAPTERS)} and step06")
    p.add_argument("--write", action="store_true", help="rewrite the READMEs' results blocks and redraw the plots")
    args = p.parse_args(argv)
    chosen = [c.split("_")[0] for c in args.chapters] or [*CHAPTERS, "step06"]
    unknown = [c for c in chosen if c not in CHAPTERS and c != "step06"]
    if unknown:
        p.error(f"no report for {', '.join(unknown)}; choose from {', '.join(CHAPTERS)}, step06")
    failed = 0
    for chapter in chosen:
        if chapter == "step06":
            from step06_triton import report as gpu

            print(gpu.tables(gpu.load()))
            if args.write:
                gpu.main(["--write"])
            continue
        try:
            text, plots = CHAPTERS[chapter]()
        except MissingResults as e:
            print(f"{chapter}: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"## {chapter}\n{text}")
        if args.write:
            folder = results.chapter_dir(chapter)
            write_block(folder / "README.md", text)
            for name, draw in plots.items():
                save_svg(draw(), folder / "results" / name)
    if not args.chapters and not failed:
        text = overview()
        print(f"## overview\n{text}")
        if args.write:
            write_block(REPO_ROOT / "README.md", text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
