"""The whole engine on the kernels: with `attention_backend="triton"` every design of chapters 2-5 (paging alone,
block hash, token radix tree, the bridge) gives step01's greedy tokens, through chunked prefill, prefix-cache
hits and preemption, with `check_invariants()` after every step and nothing left held after the drain."""
from __future__ import annotations

import pytest

from step01_kvcache.generate import SamplingParams
from step01_kvcache.tiny import tiny_model
from step06_triton.engine import make_engine
from tests.driver import drive_to_end, shared_prompts, with_reference
from tests.step06.test_kernels import DEVICE


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=7, num_heads=6, num_kv_heads=2).to(DEVICE)  # GQA groups of 3, as SmolLM2


@pytest.fixture(scope="module")
def reference(model):
    return with_reference(model, shared_prompts(5, seed=3, stem=40) + [[5]], new_tokens=5)


BLOCK = {"none": 4, "hash": 4, "radix": 1, "bridge": 4, "offset": 4}


@pytest.mark.parametrize("design", sorted(BLOCK))
def test_triton_backend_gives_step01_tokens_for_every_design(model, reference, design):
    prompts, params, expected = reference
    engine = make_engine(model, design, "triton", num_blocks=300 // BLOCK[design] * 2, block_size=BLOCK[design],
                         max_num_seqs=3, max_num_batched_tokens=24)
    for round_ in range(2):
        outs = drive_to_end(engine, prompts, params)
        assert [o.output_ids for o in outs] == expected, f"round {round_}"
    if design != "none":
        assert sum(o.num_cached_tokens for o in outs) > 0, "round 2 was meant to hit the prefix cache"


def test_preemption_and_eviction_on_the_triton_backend(model, reference):
    prompts, params, expected = reference
    engine = make_engine(model, "bridge", "triton", num_blocks=18, block_size=4, max_num_seqs=4,
                         max_num_batched_tokens=24)
    outs = drive_to_end(engine, prompts, params)
    assert [o.output_ids for o in outs] == expected
    assert sum(o.num_preemptions for o in outs) > 0, "the pool was meant to force preemption"


def test_bad_options_are_rejected(model):
    with pytest.raises(ValueError, match="attention_backend"):
        make_engine(model, "bridge", "cuda")
    with pytest.raises(ValueError, match="prefix_cache"):
        make_engine(model, "lru", "triton")
    with pytest.raises(ValueError, match="cuda_graphs"):
        make_engine(model, "bridge", "torch", cuda_graphs=True)
    engine = make_engine(model, "bridge", "triton", num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="pool has only 4"):
        engine.add_request(list(range(15)), SamplingParams(max_new_tokens=4))
    assert not engine.has_unfinished()


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU test_gpu.py captures real graphs")
def test_cuda_graphs_need_a_gpu(model):
    with pytest.raises(RuntimeError, match="CUDA device"):
        make_engine(model, "bridge", "triton", cuda_graphs=True, num_blocks=64, block_size=4)
