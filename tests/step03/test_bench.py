"""The bench's own pieces, on a tiny model: the HF prompt-cache recipe gives HF's plain answers (so its
timing compares like with like), and the micro-benchmarks run."""
from __future__ import annotations

from course.hf import to_hf_model
from course.tiny import tiny_model
from step01_kvcache.generate import SamplingParams, generate
from step03_prefix_hash.bench import hash_seconds_per_token, hf_ttfts, lookup_seconds, prefill_prefix


def test_hf_recipe_gives_the_same_first_tokens_as_plain_hf_and_ours():
    model = tiny_model(seed=5)
    hf = to_hf_model(model)
    shared = list(range(40, 70))
    prompts = [shared + [1, 2, 3], shared + [9] * 5, shared + [4]]
    cache = prefill_prefix(hf, shared)
    with_cache, first_recipe = hf_ttfts(hf, prompts, cache)
    _, first_plain = hf_ttfts(hf, prompts, None)
    ours = [generate(model, p, SamplingParams(max_new_tokens=1))[0] for p in prompts]
    assert first_recipe == first_plain == ours
    assert all(t > 0 for t in with_cache)
    assert cache.get_seq_length() == len(shared), "each request must work on a copy of the prefix cache"


def test_micro_benchmarks_run():
    assert 0 < hash_seconds_per_token(256) < 1e-3
    assert 0 < lookup_seconds(256) < 1e-2
