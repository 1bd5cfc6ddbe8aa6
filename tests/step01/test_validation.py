"""Bad input raises ValueError with a message that says what to do — before any work is done."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from step01_kvcache.config import ModelConfig
from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.tiny import tiny_config
from tests.step01.stand_in import StandInModel, argmax


@pytest.mark.parametrize("prompt,match", [
    ([], "empty prompt"),
    ([1, 256], "outside the vocabulary"),
    ([-1], "outside the vocabulary"),
    (torch.tensor([[1, 2]]), "1-D"),
    (torch.tensor([1.0, 2.0]), "integer"),
    ([1.0, 2.0], "ints"),
    ([1, True], "ints"),
    ([False], "ints"),
    ([np.bool_(True)], "ints"),
    # once accepted (their keys or bytes became token ids), or a TypeError where the rest gave a ValueError
    ({1: 2, 3: 4}, "list, tuple or 1-D tensor"), (b"\x01\x02", "list, tuple or 1-D tensor"),
    ({1, 2}, "list, tuple or 1-D tensor"), ((t for t in [1, 2]), "list, tuple or 1-D tensor"),
    (None, "list, tuple or 1-D tensor"), ("hello", "list, tuple or 1-D tensor"),
])
def test_bad_prompts(tiny, prompt, match):
    with pytest.raises(ValueError, match=match):
        generate(tiny, prompt, SamplingParams(max_new_tokens=2))


def test_prompt_plus_new_tokens_beyond_max_length(tiny):
    with pytest.raises(ValueError, match="max length 512"):
        generate(tiny, [1] * 500, SamplingParams(max_new_tokens=13))


@pytest.mark.task("task1.decode_loop")
def test_int_tensor_prompt_is_accepted():
    params = SamplingParams(max_new_tokens=2)
    assert generate(StandInModel(), torch.tensor([1, 2, 3]), params, sampler=argmax) == \
        generate(StandInModel(), [1, 2, 3], params, sampler=argmax)


def test_numpy_integer_token_ids_are_accepted(tiny):
    """Token ids straight from a tokenizer's numpy arrays (np.int64, np.int32) are ints."""
    params = SamplingParams(max_new_tokens=2)
    expected = generate(tiny, [1, 2, 3], params)
    assert generate(tiny, np.array([1, 2, 3]), params) == expected
    assert generate(tiny, [np.int32(1), np.int64(2), 3], params) == expected


@pytest.mark.parametrize("overrides,match", [
    (dict(num_heads=6, num_kv_heads=4), "multiple of num_kv_heads"),
    (dict(head_dim=15), "even"),
    (dict(num_layers=0), "num_layers"),
])
def test_bad_config(overrides, match):
    base = tiny_config().__dict__ | overrides
    with pytest.raises(ValueError, match=match):
        ModelConfig(**base)
