"""Chapter 5's measured results, for `python -m course report`: the prefix-caching table, the designs on the same
requests, their reuse and bookkeeping as the block size shrinks (results/designs.json, measured without the model),
the host tier off and on (results/multi_turn.json, the host tier's unit), and, in the unit on the mini-runtime
textbook's tree, the hash, the bridge and the offset tree through the engine (results/designs_engine.json)."""
from __future__ import annotations

from collections.abc import Callable

from benchmarks.reporting import (
    BEGIN,
    COLORS,
    Rendered,
    fmt,
    need,
    plot_hit_rates,
    prefix_cache_block,
    prefix_records,
    provenance,
    pyplot,
    register,
    svg,
    table,
)
from course import results

from . import speculative_report

OFFSET = ("<!-- offset:begin (python -m course report --write) -->", "<!-- offset:end -->")
TIER = ("<!-- tier:begin (python -m course report --write) -->", "<!-- tier:end -->")
# chapter 6 measures the same engine on an H200; chapter 5's pages link there rather than quote what comes later
GPU_RESULTS = "../step06_triton/RESULTS.md#the-engine-end-to-end"
OFFSET_COLOR = "tab:purple"


# the model-free bench's designs at each block size: (name, line style, colour, label, marker keywords)
LINES = (("hash", "s-", COLORS["step03"], "hash (ch. 3)", {"ms": 9, "mfc": "none"}),
         ("bridge", "o-", COLORS["step05"], "bridge (ch. 5)", {}),
         ("offset", "x--", OFFSET_COLOR, "offset tree (ch. 5)", {"ms": 9}))


def per_block_size(rec: dict, value: Callable[[dict, str], float], ylabel: str, title: str, log: bool = False):
    """One panel per workload: `value(row, design)` of each design against the block size, chapter 4's one-token
    slots as the star."""
    plt = pyplot()
    f = rec["figures"]
    sizes = sorted(f["block_sizes"], reverse=True)
    xs = [str(b) for b in sizes]
    fig, axes = plt.subplots(1, len(f["designs"]), figsize=(2.9 * len(f["designs"]), 3.3), squeeze=False)
    for ax, row in zip(axes[0], f["designs"]):
        for design, style, color, label, marker in LINES:
            ax.plot(xs, [value(row, f"{design} bs={b}") for b in sizes], style, color=color, label=label, **marker)
        ax.plot([xs[-1]], [value(row, "radix (ch. 4)")], "*", ms=14, color=COLORS["step04"], label="radix (ch. 4)")
        ax.set(title=row["workload"], xlabel="block size (tokens)")
        if log:
            from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # 10, 20, 50, ...: labels on narrow ranges too
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_ylim(0, 1.02)  # differences at true scale
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_block_sizes(rec: dict):
    """Chapter 5: per workload, the hash's, the bridge's and the offset tree's hit rate as the block shrinks toward
    chapter 4's one-token slots (the star). The designs sit on the same points: granularity decides the hits."""
    return per_block_size(rec, lambda row, design: row[design]["cached_tokens"] / row["prompt_tokens"],
                          "hit rate (cached / prompt tokens)", "Reuse against block size, same requests, no model")


def plot_bookkeeping(rec: dict):
    """Chapter 5: per workload, each design's bookkeeping for one warm request (µs, log) against the block size:
    the same hits, bought with different work."""
    return per_block_size(rec, lambda row, design: row[design]["bookkeeping_us"],
                          "bookkeeping per warm request (µs, log)",
                          "The cache manager's work for one warm request, same requests, no model", log=True)


def offset_section() -> str:
    """The section on the mini-runtime textbook's tree: the hash, the bridge and the offset tree through the engine
    on the real model (results/designs_engine.json), beside what the same designs hold and cost without the model at
    the same block size (results/designs.json)."""
    e, d = need("step05", "designs_engine"), need("step05", "designs")
    bs = e["figures"]["block_size"]
    free = {r["workload"]: r for r in d["figures"]["designs"]}
    rows = []
    for row in e["figures"]["designs"]:
        for design in ("hash", "bridge", "offset"):
            m, nm = row[design], free[row["workload"]][f"{design} bs={bs}"]
            rows.append([f"`{row['workload']}`", design, f"{m['hit_rate']:.3f}", m["prompt_tokens_computed"],
                         m["peak_blocks"], m["ttft_on_warm_median_s"], m["outputs_identical"], nm["cached_blocks"],
                         nm.get("offset_tokens", "–"), nm["bookkeeping_us"]])
    return ("\n" + provenance([e]) + " Beside it, without the model (`python -m benchmarks.step05.bench --save`, "
            f"the block above): the blocks each cache holds after every request, the tokens the offset tree holds "
            f"but lends to no match (the sum of its matches' offsets) and the bookkeeping per warm request, all at "
            f"{bs}-token blocks.\n\n"
            + "\n".join(table(["workload", "design", "hit rate", "prompt tokens computed", "peak blocks held",
                               "warm TTFT (s)", "same tokens", "blocks cached, no model",
                               "held, computed again", "bookkeeping µs, no model"], rows)) + "\n\n"
            "*peak blocks held*: the most blocks the running requests held at once, one round of the workload "
            "admitted together; *same tokens*: cache on = cache off.\n")


def sections() -> dict[tuple[str, str], str]:
    return {OFFSET: offset_section(), TIER: tier_block(need("step05", "multi_turn")),
            **speculative_report.sections()}


def tier_block(rec: dict) -> str:
    """The host tier off and on (results/multi_turn.json): what a load saves is a prefill, so both rates are printed
    side by side; the same experiment on a GPU is chapter 6's, linked."""
    f = rec["figures"]
    text = ("\n**The host tier** (`multi_turn`: " f"{f['requests']} turns of 3 conversations, one request at a time; a "
            f"device pool of {f['device_blocks']} blocks, which holds one conversation, and a host pool of "
            f"{f['host_blocks']}). " + provenance([rec]) + "\n\n")
    rows = [["prompt tokens computed", f["prompt_tokens_computed_off"], f["prompt_tokens_computed_on"]],
            ["hit rate", fmt(f["hit_rate_tier_off"]), fmt(f["hit_rate"])],
            ["TTFT of the later turns, mean (s)", f["ttft_off_s"], f["ttft_on_s"]],
            ["TTFT of the later turns, p99 (s)", f["ttft_off_p99_s"], f["ttft_on_p99_s"]],
            ["blocks saved / loaded back", "0 / 0", f"{f['blocks_saved']} / {f['blocks_loaded']}"],
            ["same tokens as the tier off", "", fmt(f["outputs_identical"])]]
    text += "\n".join(table(["", "tier off", "tier on"], rows)) + "\n\n"
    text += (f"Speed-up of the later turns {f['speedup_warm']}x. On this machine a token's K/V "
             f"({f['copy_bytes_per_token']:,} bytes) is copied at {f['copy_tokens_s']:,} tokens/s and computed at "
             f"{f['prefill_tokens_s']:,} tokens/s (the first turns' prefills).")
    if "ttft_fixed_s" in f:
        off, on = f["later_turns"]["off"], f["later_turns"]["on"]
        text += (f" Why the time falls less than the tokens: each later turn's (prompt tokens computed, TTFT s) is "
                 f"{', '.join(f'({x}, {y})' for x, y in off)} with the tier off and "
                 f"{', '.join(f'({x}, {y})' for x, y in on)} with it on; the line through them is TTFT = "
                 f"{f['ttft_fixed_s']} s + {f['ttft_ms_per_token']} ms per token. A forward's fixed part (every weight "
                 "read once, the engine's step) does not shrink with the tokens, and a p99 of "
                 f"{len(on)} requests is their slowest one.")
    return text + f" Chapter 6 runs the same experiment on a GPU ([its results]({GPU_RESULTS})).\n"


def short_prompt_block(short: dict, designs: dict) -> str:
    """The Pico-vLLM write-up measured prefix caching 30-40% slower on ~144-token prompts and suggested bypassing it:
    what the cache costs a request that cannot gain (cold), what it gives one that can (warm), and its own
    bookkeeping, on this machine; chapter 6 measures a cold and a warm request on a GPU (linked)."""
    f = short["figures"]
    book = {r["workload"]: r["bridge bs=16"]["bookkeeping_us"] for r in designs["figures"]["designs"]}
    cold = f["ttft_cold_on_s"] / f["ttft_cold_off_s"] - 1
    size = f["prompt_tokens"] // f["requests"]
    text = (f"\n**The write-up's short-prompt finding, here.** On `short` (prompts of ~{size} tokens) the cold "
            f"request costs {f['ttft_cold_off_s']} s with the cache off and {f['ttft_cold_on_s']} s "
            f"with it on ({cold:+.1%}, one sample each: a cold request has nothing to gain and pays the lookup and the "
            f"insert); warm requests take {f['ttft_on_warm_median_s']} s instead of {f['ttft_off_warm_median_s']} s "
            f"({f['speedup_warm']}x). The cache's own bookkeeping is {book['short']} µs per request "
            f"({book['short'] * 1e-6 / f['ttft_cold_off_s']:.2%} of a cold TTFT). Chapter 6 times a cold and a warm "
            f"`long` request on a GPU, where the engine's fixed cost per step is what the write-up met "
            f"([its results]({GPU_RESULTS})).")
    return text + "\n"


def headline() -> str:
    long5 = need("step05", "long")["figures"]
    dl = {r["workload"]: r for r in need("step05", "designs")["figures"]["designs"]}["long"]
    return (f"the bridge reuses what the hash reuses at the same block size (`long`, 16: "
            f"{dl['bridge bs=16']['cached_tokens']} vs {dl['hash bs=16']['cached_tokens']} tokens) and chapter 4's at "
            f"block size 1; `long` warm TTFT {long5['speedup_warm']}x; {speculative_report.headline()}")


@register("step05", headline, BEGIN, sections)
def render() -> Rendered:
    text, plots = prefix_cache_block("step05")
    by = {c: prefix_records(c) for c in ("step03", "step04", "step05")}
    d = need("step05", "designs")
    rows = d["figures"]["designs"]
    names = [k for k in rows[0] if k not in ("workload", "prompt_tokens")]
    text += ("\n**Chapters 3-5's designs**, same requests, hit rate as the engines measured it above:\n\n"
             "![hit rate per design](results/hit_rate.svg)\n\n"
             "**Block size**, without the model: prompt tokens each design reuses on every workload, and the "
             "cache manager's bookkeeping per warm request in µs (admit, publish or insert, free). "
             + provenance([d], "a 1-layer toy model with SmolLM2's vocabulary") + "\n\n"
             "![hit rate against block size](results/block_size.svg)\n\n"
             "![bookkeeping against block size](results/bookkeeping.svg)\n\n")
    text += "\n".join(table(["design"] + [f"`{r['workload']}` cached / µs" for r in rows],
                            [[n] + [f"{r[n]['cached_tokens']} / {r[n]['bookkeeping_us']}" for r in rows]
                             for n in names])) + "\n"
    text += short_prompt_block(need("step05", "short"), d)
    if results.load("step05", "multi_doc") is not None:  # chapter 4's policies, run on the bridge
        from benchmarks.step04.report import policy_block

        policy_text, policy_plots = policy_block("step05", "bridge")
        text += policy_text
        plots.update(policy_plots)
    plots["hit_rate.svg"] = svg(lambda: plot_hit_rates(by))
    plots["block_size.svg"] = svg(lambda: plot_block_sizes(d))
    plots["bookkeeping.svg"] = svg(lambda: plot_bookkeeping(d))
    plots.update(speculative_report.plots())
    return text, plots
