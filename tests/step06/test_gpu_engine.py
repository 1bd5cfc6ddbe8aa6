"""The engine on a GPU (run there: `pytest tests/step06`; skipped on a CPU): CUDA-graph replay — decode batches and
short single-sequence chunks, fused or not, synchronous or overlapped — gives the eager engine's tokens (fp32, where
two correct implementations agree exactly on argmax), and a step's launch never waits for the device."""
from __future__ import annotations

import pytest
import torch

from step01_kvcache.request import SamplingParams
from step01_kvcache.tiny import tiny_model
from step06_triton.engine import make_engine
from tests.driver import drive_to_end, shared_prompts, with_reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled kernels, graphs)")


@pytest.fixture(scope="module")
def model():
    torch.backends.cuda.matmul.allow_tf32 = False
    return tiny_model(seed=3, num_heads=6, num_kv_heads=2).cuda()


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("overlap", [False, True])
def test_cuda_graphs_give_the_eager_tokens(model, fuse, overlap):
    prompts, params, expected = with_reference(model, shared_prompts(9, seed=5), new_tokens=12)
    engine = make_engine(model, "bridge", "triton", cuda_graphs=True, fuse=fuse, overlap=overlap, num_blocks=256,
                         block_size=16, max_num_seqs=6, max_num_batched_tokens=64)
    assert [o.output_ids for o in drive_to_end(engine, prompts, params)] == expected
    decode_replays = engine.runner.replays
    assert decode_replays > 0, "no decode step was replayed from a graph"
    one_by_one = [engine.generate([p], params)[0] for p in prompts]  # hits run their last tokens as one chunk
    assert [o.output_ids for o in one_by_one] == expected
    assert engine.runner.replays > decode_replays + len(prompts) * (params.max_new_tokens - 1)
    engine.check_invariants()


@pytest.mark.parametrize("design,block_size", [("hash", 16), ("radix", 1), ("bridge", 16)])
@pytest.mark.parametrize("graphs", [False, True])
def test_cascade_gives_the_tokens_of_plain_decode(model, design, block_size, graphs):
    """Requests behind two system prompts (one for the hash, whose ref counts only see a prefix common to all):
    decode steps read each shared prefix once, eagerly or from the cascade graphs, with the same tokens."""
    g = torch.Generator().manual_seed(1)
    ids = lambda n: torch.randint(3, 250, (n,), generator=g).tolist()  # noqa: E731
    systems = [ids(300)] if design == "hash" else [ids(300), ids(270)]
    prompts = [systems[i % len(systems)] + ids(1 + i % 7) for i in range(12)]
    prompts, params, expected = with_reference(model, prompts, new_tokens=6)
    engine = make_engine(model, design, "triton", cuda_graphs=graphs, cascade=True, cascade_min_tokens=128,
                         cascade_min_seqs=4, num_blocks=2048 // block_size, block_size=block_size, max_num_seqs=12,
                         max_num_batched_tokens=4096)
    drive_to_end(engine, [system + [1] for system in systems], params)  # the system prompts are cached
    assert [o.output_ids for o in drive_to_end(engine, prompts, params)] == expected
    if graphs:
        assert engine.runner.cascades, "no cascade graph was captured"


def test_a_launch_never_waits_for_the_device(model):
    """Everything between two reads of sampled tokens is queued without a host-device synchronisation:
    PyTorch's sync debug mode turns any such wait inside `_launch` into an error (cascade included)."""
    prompts, params, expected = with_reference(model, shared_prompts(6, seed=2, stem=200), new_tokens=8)
    engine = make_engine(model, "bridge", "triton", cuda_graphs=True, overlap=True, cascade=True,
                         cascade_min_tokens=32, cascade_min_seqs=2, num_blocks=256, block_size=16,
                         max_num_seqs=4, max_num_batched_tokens=48)
    launch = engine._launch

    def checked(batch):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    engine._launch = checked
    assert [o.output_ids for o in drive_to_end(engine, prompts, params)] == expected


def test_seeded_sampling_is_the_same_with_and_without_overlap(model):
    prompts = shared_prompts(5, seed=4)
    params = [SamplingParams(max_new_tokens=10, temperature=0.8, top_p=0.9, seed=i) for i in range(5)]
    outs = [drive_to_end(make_engine(model, "hash", "triton", cuda_graphs=True, overlap=overlap, num_blocks=128,
                                     block_size=16, max_num_seqs=4), prompts, params) for overlap in (False, True)]
    assert [o.output_ids for o in outs[0]] == [o.output_ids for o in outs[1]]


def test_decode_graphs_take_the_split_axis_of_the_longest_context():
    """A model whose graphs serve contexts up to 4,096 tokens captures each decode batch size with 1, 4 and 8
    splits per sequence: short contexts replay the one-split graph (no merge), a long context joining the batch
    moves the step to a wider axis, and every replay gives the eager engine's tokens."""
    model = tiny_model(seed=5, num_heads=6, num_kv_heads=2, max_position_embeddings=4096).cuda()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (40, 90, 700, 2300, 130)]
    prompts, params, expected = with_reference(model, prompts, new_tokens=5)
    engine = make_engine(model, "bridge", "triton", cuda_graphs=True, num_blocks=512, block_size=16,
                         max_num_seqs=5, max_num_batched_tokens=512)
    assert engine.runner.split_axes == [1, 4, 8]
    assert [o.output_ids for o in drive_to_end(engine, prompts[:2] + prompts[4:], params)] == [
        expected[0], expected[1], expected[4]]
    assert {key[2] for key in engine.runner.replayed if key[0] == "decode"} == {1}
    assert [o.output_ids for o in drive_to_end(engine, prompts, params)] == expected
    assert {key[2] for key in engine.runner.replayed if key[0] == "decode"} >= {1, 8}
