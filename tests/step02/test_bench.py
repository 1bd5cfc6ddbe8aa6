"""The chapter's bench credits a padded Hugging Face batch with each request's own tokens only, and counts the
KV memory that batch holds, on a tiny model."""
from __future__ import annotations

import torch

from benchmarks.step02.bench import hf_batched, own_tokens
from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.hf import to_hf_model
from step01_kvcache.tiny import tiny_model


def test_own_tokens_stop_at_the_first_stop_token_inclusive():
    assert own_tokens([5, 7, 2, 0, 0], {2}) == [5, 7, 2]
    assert own_tokens([5, 7, 9], {2}) == [5, 7, 9]
    assert own_tokens([2, 2], {2}) == [2]


def test_left_padded_batch_answers_like_one_request_at_a_time():
    model = tiny_model(seed=3)
    prompts = [list(range(3, 9)), list(range(20, 40)), [11, 12]]
    params = SamplingParams(max_new_tokens=5, stop_token_ids=(0,))
    with torch.inference_mode():
        out = hf_batched(to_hf_model(model, "sdpa"), prompts, params, pad_id=1)
        ours = [generate(model, p, params) for p in prompts]
    assert out["outputs"] == ours
    steps = len(out["held_tokens"])
    assert 1 <= steps <= params.max_new_tokens
    assert out["held_tokens"] == [len(prompts) * (20 + t) for t in range(1, steps + 1)]  # every row as long as 20


def test_host_bench_times_every_chapters_manager():
    """The host bench finds every chapter's cache manager, runs each with 64 sequences decoding, and keeps every
    cell's median round, whose growth is the row's own ratio; on tiny contexts (timings themselves are not tested)."""
    from benchmarks.step02.host import host_bench

    result = host_bench(contexts=(32, 64), rounds=2)
    assert all(len(r) == 2 for r in result["growth_per_round"].values())
    assert set(result["host_us_per_step"]) == {"none", "hash", "radix", "bridge"}
    assert all(us > 0 for row in result["host_us_per_step"].values() for us in row.values())
    assert result["rounds"] == 2 and set(result["growth_longest_over_shortest"]) == set(result["host_us_per_step"])
    for name, row in result["host_us_per_step"].items():  # a reader can redo the column from the row
        assert abs(result["growth_longest_over_shortest"][name] - row[64] / row[32]) < 1e-3
    for profile in result["profile"]:  # where a step's time goes: every part of Engine.step, shares of one whole
        assert profile["context"] == 32 and all(share >= 0 for share in profile["share"].values())
        assert abs(sum(profile["share"].values()) - 1) < 0.01 and profile["top_functions"]
        assert profile["share"]["schedule"] > 0 and profile["share"]["sample"] > 0, "every part is clocked"
        assert profile["plain_us_per_step"] > 0, "the unclocked engine stepped beside it"
    assert [p["manager"] for p in result["profile"]] == list(result["host_us_per_step"])
