"""Greedy is argmax; temperature/top-p sampling is seeded, reproducible and never leaves the nucleus. `sample` is
graded alone, on logits the tests make; the last test runs the tiny model end to end."""
from __future__ import annotations

import pytest
import torch

from step01_kvcache.generate import SamplingParams, generate, sample_next
from step01_kvcache.sampling import sample
from step01_kvcache.tiny import tiny_model


@pytest.mark.task("task1.sample")
def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 3.0, -1.0, 2.9])
    assert sample_next(logits, SamplingParams(), None) == 1


@pytest.mark.task("task1.sample")
def test_a_sample_is_one_token_id_on_the_logits_device():
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=3)
    token = sample(torch.randn(50), params, params.make_generator())
    assert token.dim() == 0 and token.dtype == torch.long and token.device == torch.device("cpu")
    assert 0 <= int(token) < 50


@pytest.mark.task("task1.sample")
def test_top_p_keeps_only_the_nucleus():
    # probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p=0.7 keeps the first two tokens only
    logits = torch.log(torch.tensor([0.64, 0.24, 0.09, 0.03]))
    params = SamplingParams(temperature=1.0, top_p=0.7, seed=0)
    gen = params.make_generator()
    seen = {sample_next(logits, params, gen) for _ in range(400)}
    assert seen == {0, 1}


@pytest.mark.task("task1.sample")
@pytest.mark.parametrize("temperature,expected", [(1.0, [0.5, 0.3, 0.2]), (0.5, [25 / 38, 9 / 38, 4 / 38])])
def test_temperature_sampling_follows_the_distribution(temperature, expected):
    """Draws follow softmax(logits / temperature): at 0.5, probabilities [0.5, 0.3, 0.2] become [25, 9, 4] / 38."""
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    params = SamplingParams(temperature=temperature, seed=1)
    gen = params.make_generator()
    counts = torch.bincount(torch.tensor([sample_next(logits, params, gen) for _ in range(3000)]), minlength=3)
    freq = counts.float() / 3000
    assert torch.allclose(freq, torch.tensor(expected), atol=0.04), freq


@pytest.mark.task("task1.sample")
def test_seeded_sampling_is_reproducible():
    """The draws come from the generator handed in: the same seed gives the same tokens, another seed others."""
    logits = torch.randn(64, generator=torch.Generator().manual_seed(0))

    def draws(seed: int) -> list[int]:
        params = SamplingParams(temperature=1.0, top_p=0.95, seed=seed)
        gen = params.make_generator()
        return [sample_next(logits, params, gen) for _ in range(40)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


@pytest.mark.task("task1.rope")
@pytest.mark.task("task1.cache_attend")
@pytest.mark.task("task1.sample")
@pytest.mark.task("task1.decode_loop")
def test_seeded_generation_is_reproducible_and_cache_independent():
    """End to end, on the tiny model: a seeded sampled answer is the same run again, and with the cache off."""
    model = tiny_model(seed=7)
    params = SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.9, seed=123)
    a = generate(model, [1, 2, 3], params)
    assert a == generate(model, [1, 2, 3], params)
    assert a == generate(model, [1, 2, 3], params, use_cache=False)
    other = generate(model, [1, 2, 3], SamplingParams(max_new_tokens=16, temperature=0.8, top_p=0.9, seed=124))
    assert a != other


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"),
    # each of these was once accepted, and broke every later step of every batch it joined (or looped forever)
    (dict(max_new_tokens=float("nan")), "max_new_tokens"), (dict(max_new_tokens=2.5), "max_new_tokens"),
    (dict(max_new_tokens=True), "max_new_tokens"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature=1e-300), "temperature"),
    (dict(temperature="0.5"), "temperature"), (dict(top_p=float("nan")), "top_p"), (dict(seed=-1), "seed"),
    (dict(seed=1.5), "seed"), (dict(stop_token_ids=2), "collection of token ids"),
    (dict(stop_token_ids="2"), "collection of token ids"), (dict(stop_token_ids=(2, -1)), "collection"),
    (dict(stop_token_ids=(True,)), "collection"),
])
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_stop_token_ids_are_kept_as_a_tuple():
    assert SamplingParams(stop_token_ids=[7, 2, 7]).stop_token_ids == (2, 7)
    assert SamplingParams(stop_token_ids={3}).stop_token_ids == (3,)
