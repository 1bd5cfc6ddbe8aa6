"""The CUDA-graph runner's host side on a CPU: static buffers, padding, the cascade work lists and the row an extend
step samples. A captured graph replays the forward it recorded on whatever the buffers hold, so
a "graph" that runs `_forward` again on the same buffers is what a replay computes; with it, every step the runner
serves from a graph must give the eager engine's tokens. (The capture itself, and the kernels compiled, are the
GPU tests': tests/step06/test_gpu_engine.py.)"""
from __future__ import annotations

from collections import Counter

import pytest

from step01_kvcache.generate import SamplingParams
from step01_kvcache.tiny import tiny_model
from step06_triton import engine as engine_module
from step06_triton.cuda_graph import CUDAGraphRunner
from tests.driver import drive_to_end, oracle, shared_prompts, speculative_engine, with_reference
from tests.step06.test_kernels import DEVICE


class Rerun:
    """Stands for a captured graph: a replay runs the captured forward again on the runner's static buffers."""

    def __init__(self, runner: CUDAGraphRunner, key: tuple[str, int, int]) -> None:
        self.runner, self.key = runner, key

    def replay(self) -> None:
        self.runner._forward(*self.key)


class RerunCapture:
    """Mixed into a `CUDAGraphRunner`: its buffers allocated as `capture` allocates them, and a `Rerun` for each
    graph; counts the replays this file asks about."""

    def capture(self, block_table, max_batch, max_extend, cascade_min_seqs=None) -> None:
        keys = self.static_buffers(block_table, max_batch, max_extend, cascade_min_seqs)
        self.graphs = {key: Rerun(self, key) for key in keys}  # the runner only calls `replay()` on a graph
        self.padded = 0  # decode replays of a batch smaller than its graph
        self.samples: Counter[int] = Counter()  # extend replays by the number of rows they sampled

    def forward(self, batch):
        graph = self._graph_for(batch)
        if graph is not None and graph[0] == "extend":
            self.samples[batch.logits_indices.shape[0]] += 1
        elif graph is not None:
            self.padded += graph[1] > batch.num_tokens
        return super().forward(batch)


class RerunGraphs(RerunCapture, CUDAGraphRunner):
    """The eager step's graphs, each a `Rerun`."""


@pytest.fixture
def graphed(monkeypatch):
    """make_engine with `cuda_graphs=True` on the CPU, its graphs `Rerun`."""
    monkeypatch.setattr(engine_module, "CUDAGraphRunner", RerunGraphs)
    return engine_module.make_engine


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3, num_heads=6, num_kv_heads=2).to(DEVICE)


def test_replays_give_the_eager_tokens(model, graphed):
    """Decode batches padded to their bucket, chunks of one prompt that sample no row (the prompt goes on) and the
    last chunk, whose sampled row the graph's LM head computes."""
    long = list(range(3, 83))  # alone, 80 new tokens in chunks of 32: two sample no row, the third samples one
    prompts, params, expected = with_reference(model, shared_prompts(6, seed=5, stem=70) + [long], new_tokens=6)
    engine = graphed(model, "bridge", "triton", cuda_graphs=True, num_blocks=128, block_size=8, max_num_seqs=5,
                     max_num_batched_tokens=32)
    assert [o.output_ids for o in drive_to_end(engine, prompts[:-1], params)] == expected[:-1]
    assert engine.runner.padded > 0, "no decode batch was padded to a larger graph"
    one_by_one = [engine.generate([p], params)[0].output_ids for p in prompts]  # each alone: its chunks replay
    assert one_by_one == expected
    assert engine.runner.samples[1] > 0, "no finished prompt sampled its row from a graph"
    assert engine.runner.samples[0] >= 2, "the long prompt's first chunks were not replayed"
    engine.check_invariants()


def test_verify_steps_sample_several_rows_of_a_replayed_chunk(model, graphed):
    """A sequence alone verifying its drafts (one kept, one not) is one chunk of 1 + drafts rows, all of them
    sampled: the replay's hidden rows give their logits."""
    answer = oracle(model)
    prompts = shared_prompts(3, seed=8, stem=30)
    engine = graphed(model, "bridge", "triton", cuda_graphs=True, num_speculative_tokens=2, num_blocks=96,
                     block_size=8, max_num_seqs=3, max_num_batched_tokens=64)
    speculative_engine(engine, answer, good=1, bad=1)
    params = SamplingParams(max_new_tokens=8)
    assert [engine.generate([p], params)[0].output_ids for p in prompts] == [answer(tuple(p), 8) for p in prompts]
    assert engine.runner.samples[3] > 0, "no verify step was replayed"
    assert engine.stats.draft_tokens > engine.stats.accepted_tokens > 0
    engine.check_invariants()


def test_cascade_graphs_refresh_their_work_lists(model, graphed):
    """Decode rows behind one cached system prompt replay the cascade graphs, whose work lists are rebuilt into
    the static buffers before each replay."""
    system = list(range(3, 83))
    prompts, params, expected = with_reference(model, [system + p for p in shared_prompts(6, seed=2, stem=10)],
                                               new_tokens=5)
    engine = graphed(model, "bridge", "triton", cuda_graphs=True, cascade=True, cascade_min_tokens=32,
                     cascade_min_seqs=2, num_blocks=160, block_size=8, max_num_seqs=6, max_num_batched_tokens=512)
    drive_to_end(engine, [system + [1]], params)  # the system prompt is cached
    assert [o.output_ids for o in drive_to_end(engine, prompts, params)] == expected
    assert any(key[0] == "cascade" for key in engine.runner.replayed), "no cascade graph was replayed"
