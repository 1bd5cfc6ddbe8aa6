"""Every bad request is refused before anything is queued, and nothing a failed call touched stays changed."""
from __future__ import annotations

import pytest

from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.tiny import tiny_model
from step02_paged import Engine, EngineConfig


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


def test_generate_queues_nothing_when_any_prompt_is_bad(model):
    """All or nothing: a bad second prompt used to leave the first queued, and the next `generate` ran it and
    dropped its output."""
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([[1, 2, 3], [1, 10**9]], SamplingParams(max_new_tokens=3))
    assert not engine.has_unfinished() and not engine.seqs
    [out] = engine.generate([[4, 5]], SamplingParams(max_new_tokens=3))
    assert out.output_ids == generate(model, [4, 5], SamplingParams(max_new_tokens=3))
    with pytest.raises(ValueError, match="SamplingParams"):
        engine.generate([[1, 2]], [{"max_new_tokens": 3}])
    assert not engine.has_unfinished()


def test_a_stop_token_outside_the_vocabulary_is_refused(model):
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4))
    with pytest.raises(ValueError, match="stop_token_ids"):
        engine.add_request([1, 2], SamplingParams(stop_token_ids=(model.config.vocab_size,)))
    assert not engine.has_unfinished()
