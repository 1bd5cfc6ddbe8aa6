"""Chapter 5's measured results, for `python -m course report`: the prefix-caching table, the three designs on the
same requests, and their reuse as the block size shrinks (results/designs.json, measured without the model)."""
from __future__ import annotations

from benchmarks.reporting import (
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


def plot_block_sizes(rec: dict):
    """Chapter 5: per workload, the bridge's and the hash's hit rate as the block shrinks toward chapter 4's
    one-token slots (the star). The two designs sit on the same points: granularity decides the hits."""
    plt = pyplot()
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
        ax.set(title=row["workload"], xlabel="block size (tokens)", ylim=(0, 1.02))  # differences at true scale
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("hit rate (cached / prompt tokens)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Reuse against block size, same requests, no model", fontsize=10)
    fig.tight_layout()
    return fig


def tier_block(rec: dict, gpu: dict | None) -> str:
    """The host tier off and on (results/multi_turn.json), and the same experiment on the H200 from chapter 6's
    engine results when they are there: what a load saves is a prefill, so both rates are printed side by side."""
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
    tier = (gpu or {}).get("smollm2_135m", {}).get("host_tier")
    if tier and "error" not in tier:
        off, on, r = tier["tier_off"], tier["tier_on"], tier["rates"]
        text += (f" On the H200 (chapter 6's `step06_triton/results/h200_engine.json`, {tier['requests']} turns of "
                 f"16 conversations): TTFT {off['ttft_mean_ms']} → {on['ttft_mean_ms']} ms "
                 f"({tier['ttft_speedup']}x), prompt tokens computed {off['prompt_tokens_computed']:,} → "
                 f"{on['prompt_tokens_computed']:,}; loads at {r['load_tokens_s']:,} tokens/s "
                 f"({r['h2d_gb_s']} GB/s) against a prefill of {r['prefill_tokens_s']:,} tokens/s.")
    return text + "\n"


def short_prompt_block(short: dict, designs: dict, gpu: dict | None) -> str:
    """The Pico-vLLM write-up measured prefix caching 30-40% slower on ~144-token prompts and suggested bypassing it:
    what the cache costs a request that cannot gain (cold), what it gives one that can (warm), and its own
    bookkeeping, on this machine and, from chapter 6's engine JSON, on the H200."""
    f = short["figures"]
    book = {r["workload"]: r["bridge bs=16"]["bookkeeping_us"] for r in designs["figures"]["designs"]}
    cold = f["ttft_cold_on_s"] / f["ttft_cold_off_s"] - 1
    size = f["prompt_tokens"] // f["requests"]
    text = (f"\n**The write-up's short-prompt finding, here.** On `short` (prompts of ~{size} tokens) the cold "
            f"request costs {f['ttft_cold_off_s']} s with the cache off and {f['ttft_cold_on_s']} s "
            f"with it on ({cold:+.1%}, one sample each: a cold request has nothing to gain and pays the lookup and the "
            f"insert); warm requests take {f['ttft_on_warm_median_s']} s instead of {f['ttft_off_warm_median_s']} s "
            f"({f['speedup_warm']}x). The cache's own bookkeeping is {book['short']} µs per request "
            f"({book['short'] * 1e-6 / f['ttft_cold_off_s']:.2%} of a cold TTFT).")
    long = (gpu or {}).get("smollm2_135m", {}).get("long")
    if long and "error" not in long:
        on, off = long["cache_on"], long["cache_off"]
        text += (f" On the H200 (chapter 6, `long`), a warm request takes {on['warm_median_ms']} ms against "
                 f"{off['warm_median_ms']} ms without the cache, and all of the engine's host work for it is "
                 f"{long['host_us_per_warm_request']} µs. The one cold request measured with the cache on took "
                 f"{on['cold_ms']} ms against {off['cold_ms']} ms off ({on['cold_ms'] / off['cold_ms'] - 1:+.0%}, "
                 "one sample each after `reset_cache`: the GPU run times no part of a cold request apart, so it "
                 "says nothing more about where a difference comes from).")
    return text + "\n"


def headline() -> str:
    long5 = need("step05", "long")["figures"]
    dl = {r["workload"]: r for r in need("step05", "designs")["figures"]["designs"]}["long"]
    return (f"the bridge reuses what the hash reuses at the same block size (`long`, 16: "
            f"{dl['bridge bs=16']['cached_tokens']} vs {dl['hash bs=16']['cached_tokens']} tokens) and chapter 4's at "
            f"block size 1; `long` warm TTFT {long5['speedup_warm']}x")


@register("step05", headline)
def render() -> Rendered:
    text, plots = prefix_cache_block("step05")
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
    text += short_prompt_block(need("step05", "short"), d, results.load("step06", "h200_engine"))
    if results.load("step05", "multi_doc") is not None:  # chapter 4's policies, run on the bridge
        from benchmarks.step04.report import policy_block

        policy_text, policy_plots = policy_block("step05", "bridge")
        text += policy_text
        plots.update(policy_plots)
    tier = results.load("step05", "multi_turn")
    if tier is not None:
        text += tier_block(tier, results.load("step06", "h200_engine"))
    plots["hit_rate.svg"] = svg(lambda: plot_hit_rates(by))
    plots["block_size.svg"] = svg(lambda: plot_block_sizes(d))
    return text, plots
