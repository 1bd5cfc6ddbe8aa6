"""Chapter 1's measured results, for `python -m course report`: decode speed with and without the cache, and one
decode step's cost against the context length, drawn from results/single.json."""
from __future__ import annotations

from benchmarks.reporting import COLORS, Rendered, fmt, need, provenance, pyplot, register, svg, table


def plot_decode_cost(rec: dict):
    """Chapter 1: one decode step's cost against the context: recomputing grows, reading the cache stays flat."""
    plt = pyplot()
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


def headline() -> str:
    one = need("step01", "single")["figures"]
    big = one["decode_step_ms"][-1]
    return (f"one decode step at {big['context']} tokens of context: {big['cache_on']} ms with the cache, "
            f"{big['cache_off']} ms recomputing; decode {one['speedup_vs_hf']}x Hugging Face `generate` (SDPA), "
            f"same tokens: {fmt(one['outputs_identical'])}")


@register("step01", headline)
def render() -> Rendered:
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
    return "\n".join(lines) + "\n", {"decode_cost.svg": svg(lambda: plot_decode_cost(rec))}
