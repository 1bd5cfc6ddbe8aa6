"""Chapter 3's measured results, for `python -m course report`: the table every prefix-caching chapter shares, and
what hashing a prompt costs, drawn from results/*.json."""
from __future__ import annotations

from benchmarks.reporting import Rendered, need, prefix_cache_block, prefix_records, register


def headline() -> str:
    long3 = prefix_records("step03")["long"]["figures"]
    return (f"`long`: hit rate {long3['hit_rate']:.3f}, warm TTFT {long3['ttft_off_warm_median_s']:.3g} s → "
            f"{long3['ttft_on_warm_median_s']:.3g} s ({long3['speedup_warm']}x, bound {long3['speedup_bound']}x); HF's "
            f"prompt-cache recipe / ours {long3['warm_ttft_vs_hf_recipe']}x")


@register("step03", headline)
def render() -> Rendered:
    text, plots = prefix_cache_block("step03")
    f = need("step03", "long")["figures"]
    text += (f"\nHashing a prompt into its chain of SHA-256 block hashes costs {f['hash_us_per_token']} µs per token "
             f"(Python's built-in `hash` of the same tuples: {f['hash_builtin_us_per_token']} µs); looking up an "
             f"already hashed 2k-token prompt takes {f['lookup_2k_ms']} ms.\n")
    return text, plots
