"""Chapter 4's measured results, for `python -m course report`: the prefix-caching table, the token tree's reuse
against chapter 3's hashed blocks on the same requests, the tree's own bookkeeping cost, and the waiting-queue
policies side by side on `multi_doc`."""
from __future__ import annotations

from benchmarks.reporting import (
    COLORS,
    WORKLOADS,
    Rendered,
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
from course.workloads import MULTI_DOC_DOCUMENTS

from .policies import WORKLOAD as POLICY_WORKLOAD

POLICY_COLORS = {"fcfs": COLORS["off"], "lpm": COLORS["step04"], "dfs-weight": "tab:purple"}  # bounded lpm: hatched


def request_label(i: int) -> str:
    """`multi_doc`'s request i: its document's letter and its question's number (A1 B1 C1 D1 A2 ...)."""
    return "ABCDEFGH"[i % MULTI_DOC_DOCUMENTS] + str(i // MULTI_DOC_DOCUMENTS + 1)


def policy_runs(chapter: str = "step04") -> tuple[dict, dict[tuple[str, str, str], dict]]:
    """A chapter's policy bench record, and its runs by (design, pool, policy)."""
    record = need(chapter, POLICY_WORKLOAD)
    return record, {(r["design"], r["pool"], r["policy"]): r for r in record["figures"]["runs"]}


def policy_headline() -> str:
    _, runs = policy_runs()
    fcfs, lpm = runs[("radix", "tight", "fcfs")], runs[("radix", "tight", "lpm")]
    return (f"`{POLICY_WORKLOAD}` in a tight pool: longest prefix match first computes {lpm['prefill_tokens']:,} "
            f"prompt tokens where arrival order computes {fcfs['prefill_tokens']:,}")


def plot_policies(record: dict, design: str = "radix"):
    """Left: prompt tokens computed per design, pool and policy. Right: each request's time to first token on
    `design` in the tight pool, per policy, requests in arrival order."""
    plt = pyplot()
    f = record["figures"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.9), gridspec_kw={"width_ratios": [1, 1.3]})
    groups = list(dict.fromkeys((r["design"], r["pool"]) for r in f["runs"]))
    labels = list(dict.fromkeys(r["policy"] for r in f["runs"]))
    width = 0.8 / len(labels)
    for j, label in enumerate(labels):
        base = label.split(",")[0]
        xs, ys = [], []
        for g, (design, pool) in enumerate(groups):
            run = next((r for r in f["runs"] if (r["design"], r["pool"], r["policy"]) == (design, pool, label)), None)
            if run:
                xs.append(g + (j - (len(labels) - 1) / 2) * width)
                ys.append(run["prefill_tokens"])
        left.bar(xs, ys, width, label=label, color=POLICY_COLORS[base], hatch="//" if "," in label else None,
                 edgecolor="black", lw=0.4)
    left.set_xticks(range(len(groups)), [f"{d}\n{p} pool" for d, p in groups])
    top = max(r["prefill_tokens"] for r in f["runs"])
    left.set(ylabel="prompt tokens computed", title="Work: prompt tokens the model ran", ylim=(0, top * 1.45))
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize=8, ncol=2, loc="upper center")
    tight = [r for r in f["runs"] if r["design"] == design and r["pool"] == "tight"]
    xs = range(f["requests"])
    for run in tight:
        base = run["policy"].split(",")[0]
        right.plot(xs, run["ttft_s"], marker="o", ms=4, color=POLICY_COLORS[base],
                   ls="--" if "," in run["policy"] else "-", label=run["policy"])
    right.set_xticks(list(xs), [request_label(i) for i in xs])
    right.set(xlabel="request (document letter, question number), in arrival order", ylabel="time to first token (s)",
              title=f"{design}, tight pool: who waits")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def policy_block(chapter: str = "step04", design: str = "radix") -> Rendered:
    """The policies side by side, from `chapter`'s results (the request delayed most is looked for on `design`):
    the table, what it says about starvation and the cost of ordering. A later chapter that runs the same bench
    on its own design can show its block with this function."""
    record, runs = policy_runs(chapter)
    f = record["figures"]
    rows = []
    for (design, pool, label), r in runs.items():
        rows.append([design, pool, label, f"{r['hit_rate']:.3f}", r["prefill_tokens"],
                     f"{r['ttft_mean_s']:.3g} / {r['ttft_p99_s']:.3g}",
                     f"{r['ttft_tokens_mean']:,.0f} / {r['ttft_tokens_p99']:,}", r["most_overtaken"],
                     " ".join(request_label(i) for i in r["admission_order"])])
    fcfs, lpm = runs[(design, "tight", "fcfs")], runs[(design, "tight", "lpm")]
    delayed = max(range(f["requests"]), key=lambda i: lpm["ttft_tokens"][i] - fcfs["ttft_tokens"][i])
    c = f["order_cost"]
    text = (f"\n**Which waiting request first** (`{POLICY_WORKLOAD}`: {f['requests']} requests, {MULTI_DOC_DOCUMENTS} "
            f"documents x 3 questions queued at once in arrival order A1 B1 C1 D1 A2 ...; {f['seats']} seats; a tight "
            f"pool of {f['pool_tight_tokens']:,} tokens holds the running requests and little more, a roomy one of "
            f"{f['pool_roomy_tokens']:,} holds every request; {f['new_tokens']} new tokens each; each run's fastest "
            f"of {f['passes']} passes). {provenance([record])}\n\n"
            "![prompt tokens computed and time to first token per policy](results/policies.svg)\n\n")
    text += "\n".join(table(["design", "pool", "policy", "hit rate", "prompt tokens computed", "TTFT mean / p99 (s)",
                             "TTFT mean / p99 (tokens run first)", "most overtaken", "admission order"], rows))
    text += (f"\n\n*TTFT in tokens run first*: the prompt and decode tokens the engine ran before the request's first "
             "token, which load on the machine cannot move (p99 of 12 requests is the slowest). *most overtaken*: "
             "the most requests that arrived after some request and were admitted before it. Same answers under every "
             f"policy and design: {'yes' if f['outputs_identical'] else '**no**'}. Tokens count work, not steps: a "
             "decode step of two requests costs nearly what a prefill chunk costs here, so seconds and tokens do not "
             f"move in proportion. The request lpm delays most ({design}, tight pool) is {request_label(delayed)}: "
             f"{fcfs['ttft_tokens'][delayed]:,} tokens run before its first token under fcfs "
             f"({fcfs['ttft_s'][delayed]:.3g} s), {lpm['ttft_tokens'][delayed]:,} under lpm "
             f"({lpm['ttft_s'][delayed]:.3g} s).\n\n"
             f"Ordering costs one lookup per waiting request at every admission step: for prompts of "
             f"{c['prompt_tokens']:,} tokens, a queue of 16 takes {c['lpm_16_us']:,.0f} µs, 128 take "
             f"{c['lpm_128_us']:,.0f} µs, 1,024 take {c['lpm_1024_us']:,.0f} µs; above 128 the queue goes back to "
             f"arrival order without a lookup ({c['fallback_1024_us']:,.0f} µs for 1,024).\n")
    return text, {"policies.svg": svg(lambda: plot_policies(record, design))}


def headline() -> str:
    p3, p4 = prefix_records("step03"), prefix_records("step04")
    d3, d4 = p3["diverge"]["figures"], p4["diverge"]["figures"]
    return (f"`diverge`: the token tree reuses {d4['cached_tokens']} prompt tokens where chapter 3's 16-token hash "
            f"reuses {d3['cached_tokens']}; `long` warm TTFT {p4['long']['figures']['speedup_warm']}x; "
            + policy_headline())


@register("step04", headline)
def render() -> Rendered:
    text, plots = prefix_cache_block("step04")
    by = {c: prefix_records(c) for c in ("step03", "step04")}
    f = need("step04", "long")["figures"]
    text += ("\n**Hash against radix**, the same requests (chapter 3's block hash at 16 tokens, this chapter's tree "
             "at 1):\n\n![hit rate per design](results/hit_rate.svg)\n\n")
    text += "\n".join(table(["workload", "prompt tokens", "cached: hash", "cached: radix"],
                            [[f"`{w}`", by["step04"][w]["figures"]["prompt_tokens"],
                              by["step03"][w]["figures"]["cached_tokens"], by["step04"][w]["figures"]["cached_tokens"]]
                             for w in WORKLOADS]))
    text += (f"\n\nThe tree's own work for one request of the Pico-vLLM write-up's shape in random token ids "
             f"({f['bookkeeping_tokens']:,} tokens, [`long` (GPU)](../WORKLOADS.md#long-gpu): match, lock, insert, "
             f"unlock): median {f['bookkeeping_us_median']} µs (match "
             f"{f['bookkeeping_match_us']}, lock {f['bookkeeping_lock_us']}, insert {f['bookkeeping_insert_us']}, "
             f"unlock {f['bookkeeping_unlock_us']}).\n")
    plots["hit_rate.svg"] = svg(lambda: plot_hit_rates(by))
    policies, drawn = policy_block()
    return text + policies, plots | drawn
