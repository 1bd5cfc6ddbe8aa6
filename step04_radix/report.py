"""Chapter 4's measured results, for `python -m course report`: the prefix-caching table, the token tree's reuse
against chapter 3's hashed blocks on the same requests, and the tree's own bookkeeping cost."""
from __future__ import annotations

from course.report import (
    WORKLOADS,
    Rendered,
    need,
    plot_hit_rates,
    prefix_cache_block,
    prefix_records,
    register,
    svg,
    table,
)


def headline() -> str:
    p3, p4 = prefix_records("step03"), prefix_records("step04")
    d3, d4 = p3["diverge"]["figures"], p4["diverge"]["figures"]
    return (f"`diverge`: the token tree reuses {d4['cached_tokens']} prompt tokens where chapter 3's 16-token hash "
            f"reuses {d3['cached_tokens']}; `long` warm TTFT {p4['long']['figures']['speedup_warm']}x")


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
    text += (f"\n\nThe tree's own work for one request of `long`'s shape ({f['bookkeeping_tokens']} tokens: "
             f"match, lock, insert, unlock): median {f['bookkeeping_us_median']} µs (match "
             f"{f['bookkeeping_match_us']}, lock {f['bookkeeping_lock_us']}, insert {f['bookkeeping_insert_us']}, "
             f"unlock {f['bookkeeping_unlock_us']}).\n")
    plots["hit_rate.svg"] = svg(lambda: plot_hit_rates(by))
    return text, plots
