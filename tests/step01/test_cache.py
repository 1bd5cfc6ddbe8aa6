"""Cache on must equal cache off, token for token; the cache must reject what does not fit."""
from __future__ import annotations

import pytest
import torch

from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.kv_cache import KVCache
from step01_kvcache.tiny import tiny_model


@pytest.mark.task("task1.cache_attend")
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (8, 1)])
def test_incremental_logits_equal_full_forward(heads, kv_heads):
    """Prefill 10 tokens, then feed 1, 3 and 5 more through the cache: same logits as one full forward."""
    model = tiny_model(seed=3, num_heads=heads, num_kv_heads=kv_heads)
    ids = torch.randint(0, 256, (19,), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        full = model.compute_logits(model(ids, torch.arange(19)))
        cache = KVCache(model.config, 19)
        pieces = []
        for start, end in [(0, 10), (10, 11), (11, 14), (14, 19)]:
            pieces.append(model.compute_logits(model(ids[start:end], torch.arange(start, end), cache)))
            cache.advance(end - start)
    assert cache.length == 19
    torch.testing.assert_close(torch.cat(pieces), full, atol=1e-5, rtol=1e-5)


@pytest.mark.task("task1.cache_attend")
@pytest.mark.task("task1.decode_loop")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generate_cached_equals_uncached(seed):
    model = tiny_model(seed=seed)
    prompt = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
    params = SamplingParams(max_new_tokens=24)
    cached = generate(model, prompt, params, use_cache=True)
    assert cached == generate(model, prompt, params, use_cache=False)
    assert len(cached) == 24


@pytest.mark.task("task1.decode_loop")
def test_generate_stops_at_stop_token_and_includes_it():
    model = tiny_model(seed=5)
    prompt = [1, 2, 3, 4]
    free = generate(model, prompt, SamplingParams(max_new_tokens=10))
    stop = free[4]
    first = free.index(stop)
    out = generate(model, prompt, SamplingParams(max_new_tokens=10, stop_token_ids=(stop,)))
    assert out == free[: first + 1]


@pytest.mark.task("task1.decode_loop")
def test_generate_is_greedy_argmax_of_full_forward():
    """Each generated token is the argmax of an uncached forward over prompt + tokens so far."""
    model = tiny_model(seed=6)
    prompt = [5, 6, 7]
    out = generate(model, prompt, SamplingParams(max_new_tokens=6))
    seq = list(prompt)
    with torch.inference_mode():
        for tok in out:
            logits = model.compute_logits(model(torch.tensor(seq), torch.arange(len(seq))))[-1]
            assert tok == int(logits.argmax())
            seq.append(tok)


@pytest.mark.task("task1.cache_attend")
def test_cache_overflow_is_a_clear_error(tiny):
    cache = KVCache(tiny.config, 4)
    with pytest.raises(ValueError, match="KV cache full"):
        tiny(torch.arange(5), torch.arange(5), cache)


def test_cache_rejects_bad_max_len(tiny):
    with pytest.raises(ValueError, match="max_len"):
        KVCache(tiny.config, 0)


def test_step_costs_time_every_length_with_and_without_the_cache():
    from step01_kvcache.cost import format_costs, step_costs
    from step01_kvcache.tiny import tiny_model

    rows = step_costs(tiny_model(seed=0), [4, 16], repeats=2)
    assert [r.context_len for r in rows] == [4, 16]
    assert all(r.cached_s > 0 and r.uncached_s > 0 for r in rows)
    assert format_costs(rows).count("\n") == 2
