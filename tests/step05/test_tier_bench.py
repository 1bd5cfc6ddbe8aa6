"""The host-tier bench's explanation of its own numbers: the line through (tokens computed, TTFT) of the later
turns recovers a fixed cost and a cost per token (on made-up outputs; timings themselves are not tested)."""
from types import SimpleNamespace

from benchmarks.step05.tier import ttft_fit


def test_ttft_fit_recovers_a_fixed_cost_and_a_cost_per_token():
    prompts = [[0] * n for n in (40, 50, 60, 100, 120, 140)]  # 3 first turns, 3 later ones
    fixed, per_token = 0.25, 0.002

    def outs(cached: list[int]) -> list:
        return [SimpleNamespace(num_cached_tokens=c, ttft_s=fixed + per_token * (len(p) - c))
                for p, c in zip(prompts, cached)]

    fit = ttft_fit({"off": outs([0] * 6), "on": outs([0, 0, 0, 64, 96, 80])}, prompts, turns=3)
    assert fit["later_turns"]["off"] == [[100, 0.45], [120, 0.49], [140, 0.53]]
    assert [x for x, _ in fit["later_turns"]["on"]] == [36, 24, 60]
    assert abs(fit["ttft_fixed_s"] - fixed) < 1e-4 and abs(fit["ttft_ms_per_token"] - per_token * 1e3) < 1e-3
