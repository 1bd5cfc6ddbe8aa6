"""A tiny random model in SmolLM2's vocabulary, so that the real tokenizer and chat template drive it, behind the
chapter's server on 127.0.0.1 (any free port), in a thread of the test process: a test can look at the engine
while the server runs, and the server stops with the fixture."""
from __future__ import annotations

import pytest

from step01_kvcache.tiny import tiny_model
from step02_paged import Engine, EngineConfig
from step03_prefix_hash import PrefixCachingKVCacheManager
from step07_serving import make_app, running

MODEL = "tiny"


@pytest.fixture(scope="module")
def model():
    return tiny_model(vocab_size=49152)


def tiny_engine(model, manager=PrefixCachingKVCacheManager, **config) -> Engine:
    return Engine(model, EngineConfig(**{"num_blocks": 64, "block_size": 16, **config}), manager)


@pytest.fixture(scope="module")
def served(model, tokenizer):
    """(base URL, engine) of a running server with chapter 3's cache."""
    engine = tiny_engine(model)
    with running(make_app(engine, tokenizer, MODEL)) as url:
        yield url, engine
