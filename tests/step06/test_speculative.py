"""Speculative decoding on chapter 6's engine: the Triton kernels verify drafts as they run a prefill chunk (the
synchronous engine gives step01's tokens on the kernels too); the overlapped engine refuses drafts, since it
schedules a step before it knows how many of the previous step's drafts were kept."""
from __future__ import annotations

import pytest

from step01_kvcache.generate import SamplingParams
from step01_kvcache.tiny import tiny_model
from step05_bridge.speculative_engine import SpeculativeEngine
from step06_triton.engine import make_engine
from tests.driver import drive_to_end, oracle, shared_prompts, speculative_engine
from tests.step06.test_kernels import DEVICE

MODEL = tiny_model(seed=7, num_heads=6, num_kv_heads=2).to(DEVICE)
answer = oracle(MODEL)


def test_the_triton_backend_verifies_drafts():
    prompts = shared_prompts(3, seed=3, stem=20)
    engine = make_engine(MODEL, "bridge", "triton", num_blocks=64, block_size=4, max_num_seqs=4,
                         max_num_batched_tokens=24, num_speculative_tokens=3)
    outs = drive_to_end(speculative_engine(engine, answer, good=1, bad=2), prompts, SamplingParams(max_new_tokens=6))
    assert [o.output_ids for o in outs] == [answer(tuple(p), 6) for p in prompts]
    assert engine.stats.draft_tokens > engine.stats.accepted_tokens > 0


def test_the_overlapped_engine_refuses_speculation():
    with pytest.raises(ValueError, match="overlap=False"):
        make_engine(MODEL, "bridge", "torch", overlap=True, num_speculative_tokens=2)
    assert not isinstance(make_engine(MODEL, "bridge", "torch", overlap=True), SpeculativeEngine)
