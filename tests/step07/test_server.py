"""The server through the `openai` client: what it answers is what the engine computes, the prefix cache's hits show
in the usage, and every request's blocks come back."""
from __future__ import annotations

import httpx
import openai
import pytest

from step01_kvcache.request import SamplingParams

from .conftest import MODEL, tiny_engine

pytestmark = pytest.mark.timeout(120)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_completion_is_the_engines_greedy_answer(served, model, tokenizer):
    url, engine = served
    prompt = "The capital of France is a city on the river"
    answer = client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    ids = tokenizer(prompt)["input_ids"]
    expected = tiny_engine(model).generate([ids], SamplingParams(max_new_tokens=8))[0].output_ids
    assert answer.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)
    assert answer.choices[0].finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(ids), 8)
    engine.check_invariants()


def test_a_repeated_prompt_is_served_from_the_cache(served):
    url, engine = served
    prompt = list(range(1000, 1040))  # token ids: 40 tokens, two full blocks of 16 before the last token
    first, second = (client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
                     for _ in range(2))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 32
    assert second.choices[0].text == first.choices[0].text
    assert not engine.has_unfinished() and engine.cache_manager.slot_usage() == (0, 0)
    engine.check_invariants()


def test_models_and_health(served):
    url, _ = served
    assert [m.id for m in client(url).models.list()] == [MODEL]
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
