"""Cache on must equal cache off, token for token; the cache must reject what does not fit.

Each task is graded alone: `KVCache.attend` against attention written out here, on K/V the test makes;
`generate` with a stand-in model and sampler (tests/step01/stand_in.py) that run neither attention, RoPE nor
sampling. The tests on the tiny model run them all together, and are tagged with every task they run."""
from __future__ import annotations

import math

import pytest
import torch

from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.kv_cache import KVCache
from step01_kvcache.tiny import tiny_config, tiny_model
from tests.step01.stand_in import StandInModel, argmax, greedy_answer

CHUNKS = [(0, 10), (10, 11), (11, 14), (14, 19)]  # a 10-token prefill, then 1, 3 and 5 tokens


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The T queries q [T, Hq, D] are the last T of the S keys k, v [S, Hkv, D]; query head h reads KV head
    h // (Hq / Hkv); query i sees keys 0 .. S - T + i. Returns [T, Hq * D]. One head at a time, for clarity."""
    T, Hq, D = q.shape
    S, Hkv = k.shape[:2]
    out = torch.empty(T, Hq, D)
    for h in range(Hq):
        kh, vh = k[:, h // (Hq // Hkv)], v[:, h // (Hq // Hkv)]
        scores = q[:, h] @ kh.T / math.sqrt(D)  # [T, S]
        hidden = torch.arange(S)[None, :] > torch.arange(S - T, S)[:, None]
        out[:, h] = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ vh
    return out.reshape(T, Hq * D)


@pytest.mark.task("task1.cache_attend")
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (8, 1)])
def test_attend_stores_then_attends_over_everything_cached(heads, kv_heads):
    """Chunks of 10, 1, 3 and 5 tokens through `attend`, every layer with its own K/V: each output equals causal
    attention over all the tokens so far, each layer's K/V land in that layer's rows, and `attend` leaves
    `length` to `advance`."""
    cfg = tiny_config(num_heads=heads, num_kv_heads=kv_heads)
    gen = torch.Generator().manual_seed(5)
    L, n = cfg.num_layers, CHUNKS[-1][1]
    q = torch.randn(L, n, heads, cfg.head_dim, generator=gen)
    k = torch.randn(L, n, kv_heads, cfg.head_dim, generator=gen)
    v = torch.randn(L, n, kv_heads, cfg.head_dim, generator=gen)
    cache = KVCache(cfg, n)
    for start, end in CHUNKS:
        for layer in range(L):
            out = cache.attend(layer, q[layer, start:end], k[layer, start:end], v[layer, start:end])
            assert cache.length == start, "attend must not move length: the model calls advance once per forward"
            torch.testing.assert_close(out, causal_attention(q[layer, start:end], k[layer, :end], v[layer, :end]),
                                       atol=1e-5, rtol=1e-5)
        cache.advance(end - start)
    torch.testing.assert_close(cache.k, k)
    torch.testing.assert_close(cache.v, v)


@pytest.mark.task("task1.cache_attend")
def test_a_token_that_does_not_fit_is_refused_and_nothing_moves():
    cfg = tiny_config()
    q, k, v = torch.randn(5, 4, 16), torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    cache = KVCache(cfg, 4)
    cache.attend(0, q[:3], k[:3], v[:3])
    cache.advance(3)
    before = cache.k.clone(), cache.v.clone()
    with pytest.raises(ValueError, match="KV cache full"):
        cache.attend(0, q[3:], k[3:], v[3:])
    assert cache.length == 3
    assert torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])
    cache.attend(0, q[3:4], k[3:4], v[3:4])  # the last free position still takes one token
    torch.testing.assert_close(cache.k[0, :4], k[:4])


@pytest.mark.task("task1.rope")
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
        for start, end in CHUNKS:
            pieces.append(model.compute_logits(model(ids[start:end], torch.arange(start, end), cache)))
            cache.advance(end - start)
    assert cache.length == 19
    torch.testing.assert_close(torch.cat(pieces), full, atol=1e-5, rtol=1e-5)


@pytest.mark.task("task1.rope")
@pytest.mark.task("task1.cache_attend")
@pytest.mark.task("task1.sample")
@pytest.mark.task("task1.decode_loop")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generate_cached_equals_uncached(seed):
    """End to end, on the tiny model: chapter 1's answer is the same with the cache and without it."""
    model = tiny_model(seed=seed)
    prompt = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
    params = SamplingParams(max_new_tokens=24)
    cached = generate(model, prompt, params, use_cache=True)
    assert cached == generate(model, prompt, params, use_cache=False)
    assert len(cached) == 24


@pytest.mark.task("task1.decode_loop")
@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_is_the_greedy_answer(use_cache):
    """Each new token is the argmax after everything before it; exactly max_new_tokens of them."""
    prompt = [5, 6, 7, 200]
    out = generate(StandInModel(), prompt, SamplingParams(max_new_tokens=9), use_cache, argmax)
    assert out == greedy_answer(prompt, 9)


@pytest.mark.task("task1.decode_loop")
def test_with_a_cache_the_prompt_runs_once_then_one_token_a_step():
    model = StandInModel()
    out = generate(model, [3, 1, 4], SamplingParams(max_new_tokens=4), sampler=argmax)
    assert model.calls == [([3, 1, 4], [0, 1, 2], True)] + [([t], [3 + i], True) for i, t in enumerate(out[:-1])]


@pytest.mark.task("task1.decode_loop")
def test_without_a_cache_every_step_runs_the_whole_sequence():
    model = StandInModel()
    out = generate(model, [3, 1, 4], SamplingParams(max_new_tokens=3), use_cache=False, sampler=argmax)
    seqs = [[3, 1, 4] + out[:i] for i in range(3)]
    assert model.calls == [(s, list(range(len(s))), False) for s in seqs]


@pytest.mark.task("task1.decode_loop")
@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_stops_at_stop_token_and_includes_it(use_cache):
    prompt = [1, 2, 3, 4]
    free = greedy_answer(prompt, 10)
    stop = free[4]
    out = generate(StandInModel(), prompt, SamplingParams(max_new_tokens=10, stop_token_ids=(stop,)), use_cache, argmax)
    assert out == free[: free.index(stop) + 1]
    another = generate(StandInModel(), prompt, SamplingParams(max_new_tokens=10, stop_token_ids=(999, stop)),
                       use_cache, argmax)
    assert another == out, "any of the stop tokens stops the answer"


@pytest.mark.task("task1.rope")
@pytest.mark.task("task1.cache_attend")
@pytest.mark.task("task1.sample")
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
