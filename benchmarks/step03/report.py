"""Chapter 3's measured results, for `python -m course report`: the table every prefix-caching chapter shares, and
what hashing a prompt costs, drawn from results/*.json, on the chapter's results page (RESULTS.md); the lesson's
*Measured here* shows the warm requests' part of it between its own markers (`sections`)."""
from __future__ import annotations

from benchmarks.reporting import Rendered, need, prefix_cache_block, prefix_records, register, table

WARM = "<!-- warm:begin (python -m course report --write) -->", "<!-- warm:end -->"  # the lesson's Measured here


def headline() -> str:
    long3 = prefix_records("step03")["long"]["figures"]
    return (f"`long`: hit rate {long3['hit_rate']:.3f}, warm TTFT {long3['ttft_off_warm_median_s']:.3g} s → "
            f"{long3['ttft_on_warm_median_s']:.3g} s ({long3['speedup_warm']}x, bound {long3['speedup_bound']}x); HF's "
            f"prompt-cache recipe / ours {long3['warm_ttft_vs_hf_recipe']}x")


def sections() -> dict[tuple[str, str], str]:
    """The lesson's table: what the cache does for warm requests, per workload, with the machine it ran on."""
    recs = prefix_records("step03")
    rows = []
    for w, rec in recs.items():
        f = rec["figures"]
        rows.append([f"`{w}`", f"{f['hit_rate']:.3f}",
                     f"{f['ttft_off_warm_median_s']:.3g} / {f['ttft_on_warm_median_s']:.3g}",
                     f"{f['speedup_warm']}x", f"{f['speedup_bound']}x",
                     f"{f['kv_peak_bytes_off'] / 2**20:.0f} / {f['kv_peak_bytes_on'] / 2**20:.0f}",
                     f["outputs_identical"] and f["hf_first_tokens_match"]])
    m, date = recs["long"]["machine"], recs["long"]["date"][:10]
    caption = (f"SmolLM2-135M-Instruct in fp32, measured on {m['cpu']} with {m['cores']} cores, torch {m['torch']}, "
               f"on {date}; *warm* is the median request after the first:")
    lines = [caption, ""] + table(["workload", "hit rate", "warm TTFT off / on (s)", "warm speed-up", "bound",
                                   "KV peak off / on (MiB)", "same tokens"], rows)
    return {WARM: "\n".join(lines) + "\n"}


@register("step03", headline, sections=sections)
def render() -> Rendered:
    text, plots = prefix_cache_block("step03")
    f = need("step03", "long")["figures"]
    text += (f"\nHashing a prompt into its chain of SHA-256 block hashes costs {f['hash_us_per_token']} µs per token "
             f"(Python's built-in `hash` of the same tuples: {f['hash_builtin_us_per_token']} µs); looking up an "
             f"already hashed 2k-token prompt takes {f['lookup_2k_ms']} ms.\n")
    return text, plots
