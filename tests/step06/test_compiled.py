"""The compiled runner (compiled_runner.py): the model compiled by torch.compile with Inductor (on a CPU Inductor
writes C++ and builds it with the machine's compiler), attention the custom op `kvcourse::attend`. In fp32 its
greedy tokens equal the eager runner's, token for token, through steps that mix decodes with prefill chunks, for
every design of chapters 2-5 on the torch backend and for the bridge on the Triton kernels (their interpreter on a
CPU); the graph holds one opaque attention call per layer and is compiled once per process and model. What a CUDA
graph of the compiled step computes (the compiled forward at each graph's padded size, on its static buffers) is
checked on a CPU too; capturing and replaying the graphs only on a GPU (skipped on a CPU)."""
from __future__ import annotations

import pytest
import torch

from step01_kvcache.generate import SamplingParams
from step01_kvcache.tiny import tiny_model
from step06_triton import engine as engine_module
from step06_triton.compiled_runner import CompiledModel, CompiledRunner, NoAttention, compiled_model, forward_context
from step06_triton.engine import make_engine
from tests.driver import drive_to_end, shared_prompts
from tests.step06.test_graph_buffers import RerunCapture
from tests.step06.test_kernels import DEVICE

BLOCK = {"none": 4, "hash": 4, "radix": 1, "bridge": 4}


@pytest.fixture(scope="module")
def model():
    """The tiny model, compiled here once for the whole file (Inductor on a CPU: 10-50 s, the most of the file's
    time; every engine below reuses the compile)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model = tiny_model(seed=7, num_heads=6, num_kv_heads=2).to(DEVICE)  # GQA groups of 3, as SmolLM2
    torch.set_num_threads(1)  # as conftest.py sets it for every tiny-model test: Dynamo's guards hold the count
    compiled_model(model)
    return model


def build(model, design: str, backend: str, compile: bool, **options):
    return make_engine(model, design, backend, compile=compile, num_blocks=600 // BLOCK[design],
                       block_size=BLOCK[design], max_num_seqs=4, max_num_batched_tokens=20, **options)


def mixed_steps(engine) -> list[tuple[int, int]]:
    """Record (decode rows, chunk rows) of every step the engine's runner runs."""
    seen, forward = [], engine.runner.forward

    def recording(batch):
        seen.append((batch.num_decodes, batch.num_tokens - batch.num_decodes))
        return forward(batch)

    engine.runner.forward = recording
    return seen


def tokens_of(engine, prompts, params, rounds: int = 2) -> list[list[list[int]]]:
    """Each round's outputs (the second finds the first's prefixes cached)."""
    return [[o.output_ids for o in drive_to_end(engine, prompts, params)] for _ in range(rounds)]


@pytest.mark.parametrize("design", sorted(BLOCK))
def test_compiled_tokens_equal_the_eager_runners_on_every_design(model, design):
    prompts, params = shared_prompts(6, seed=3, stem=40), SamplingParams(max_new_tokens=6)
    compiled = build(model, design, "torch", compile=True)
    assert isinstance(compiled.runner, CompiledRunner) and compiled.runner.compile_seconds > 0
    steps = mixed_steps(compiled)
    expected = tokens_of(build(model, design, "torch", compile=False), prompts, params)
    assert tokens_of(compiled, prompts, params) == expected
    assert any(d and c for d, c in steps), "no step mixed decodes with a prefill chunk"
    assert any(d + c == 1 for d, c in steps), "a single-token step was meant to run through the same graph"


def test_compiled_tokens_equal_the_eager_runners_on_the_triton_kernels(model):
    """The bridge on the Triton kernels (interpreted on a CPU: tens of seconds for these few tokens)."""
    prompts, params = shared_prompts(4, seed=5, stem=24), SamplingParams(max_new_tokens=4)
    compiled = build(model, "bridge", "triton", compile=True)
    steps = mixed_steps(compiled)
    expected = tokens_of(build(model, "bridge", "triton", compile=False), prompts, params, rounds=1)
    assert tokens_of(compiled, prompts, params, rounds=1) == expected
    assert any(d and c for d, c in steps), "no step mixed decodes with a prefill chunk"


def test_compiled_once_per_process_and_model(model):
    """Every engine on the same model shares one compiled model; no step compiles again (sizes 1 to the token
    budget run through the graph compiled for 8 tokens)."""
    from torch._dynamo.utils import counters
    first = build(model, "hash", "torch", compile=True)
    graphs = counters["stats"]["unique_graphs"]
    second = build(model, "radix", "torch", compile=True)
    assert second.runner.compiled is first.runner.compiled is compiled_model(model)
    tokens_of(second, shared_prompts(3, seed=9, stem=30), SamplingParams(max_new_tokens=3), rounds=1)
    assert counters["stats"]["unique_graphs"] == graphs, "a step compiled the model again"


class RerunCompiled(RerunCapture, CompiledRunner):
    """The compiled runner with its graphs' buffers, each graph a `Rerun` (tests/step06/test_graph_buffers.py)."""


def test_the_compiled_step_on_the_graphs_buffers_gives_the_eager_tokens(model, monkeypatch):
    """What a replay of the compiled step computes, on a CPU: the compiled forward run at each graph's padded size
    on its static buffers (padded decode batches, a prompt's chunks alone, its sampled row's logits from the
    graph) gives the eager runner's tokens, without compiling again for the padded sizes."""
    from torch._dynamo.utils import counters
    monkeypatch.setattr(engine_module, "CompiledRunner", RerunCompiled)
    prompts = shared_prompts(5, seed=4, stem=30) + [list(range(3, 50))]
    params = SamplingParams(max_new_tokens=4)
    options = dict(num_blocks=150, block_size=4, max_num_seqs=8, max_num_batched_tokens=20)
    expected = [o.output_ids for o in drive_to_end(make_engine(model, "bridge", "triton", **options), prompts, params)]
    graphs = counters["stats"]["unique_graphs"]
    engine = make_engine(model, "bridge", "triton", compile=True, cuda_graphs=True, **options)
    assert isinstance(engine.runner, RerunCompiled)
    assert [engine.generate([p], params)[0].output_ids for p in prompts] == expected  # each alone: its chunks
    assert [o.output_ids for o in drive_to_end(engine, prompts, params)] == expected  # decode batches
    assert engine.runner.padded > 0 and engine.runner.samples[0] > 0 and engine.runner.samples[1] > 0
    assert counters["stats"]["unique_graphs"] == graphs, "a padded size compiled the model again"


@pytest.mark.parametrize("merge,products", [(True, 4), (False, 7)])
def test_the_graph_calls_attention_as_one_opaque_op_per_layer(model, merge, products):
    """A backend that only records the graph Dynamo hands it: the model's code is traced, attention is not; merged,
    a layer's q/k/v are one product and gate/up another (4 products a layer, not 7)."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = CompiledModel(model, backend=record, merge=merge)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    layers = model.config.num_layers
    assert sum(t.startswith("kvcourse.attend") for t in targets) == layers, targets
    assert sum("linear" in t for t in targets) == products * layers, targets
    with torch.inference_mode(), forward_context(NoAttention()):
        out = torch.ops.kvcourse.attend(*(torch.randn(3, h, 16) for h in (6, 2, 2)), 0)
    assert out.shape == (3, 96) and not out.any()
    with pytest.raises(RuntimeError, match="forward_context"):
        torch.ops.kvcourse.attend(*(torch.randn(3, h, 16) for h in (6, 2, 2)), 0)
    assert compiled.compile_seconds > 0


def test_the_op_passes_torch_library_checks():
    """Schema, fake implementation and dynamic-shape tracing of the op, as `torch.library.opcheck` tests them."""
    q, k, v = torch.randn(5, 6, 16), torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    with forward_context(NoAttention()):
        torch.library.opcheck(torch.ops.kvcourse.attend.default, (q, k, v, 1))


def test_options_that_make_no_sense_are_refused(model):
    with pytest.raises(ValueError, match="fuse is the hand-fused step"):
        make_engine(model, "bridge", "triton", compile=True, cuda_graphs=True, fuse=True)
    with pytest.raises(ValueError, match="cuda_graphs replays the Triton decode step"):
        make_engine(model, "bridge", "torch", compile=True, cuda_graphs=True)
    with pytest.raises(ValueError, match="compile must be True or False"):
        make_engine(model, "bridge", "torch", compile="inductor")
    with pytest.raises(ValueError, match="dynamic must be"):
        CompiledModel(model, dynamic="static")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs of the compiled step)")
@pytest.mark.parametrize("overlap", [False, True])
def test_cuda_graphs_of_the_compiled_step_give_the_eager_tokens(model, overlap):
    prompts, params = shared_prompts(9, seed=5), SamplingParams(max_new_tokens=12)
    options = dict(num_blocks=256, block_size=16, max_num_seqs=6, max_num_batched_tokens=64)
    expected = [o.output_ids for o in drive_to_end(make_engine(model, "bridge", "triton", **options), prompts, params)]
    graphed = make_engine(model, "bridge", "triton", compile=True, cuda_graphs=True, overlap=overlap, **options)
    assert [o.output_ids for o in drive_to_end(graphed, prompts, params)] == expected
    assert graphed.runner.replays > 0, "no decode step was replayed from a graph"
    one_by_one = [graphed.generate([p], params)[0].output_ids for p in prompts]  # hits: their chunk from a graph
    assert one_by_one == expected
    graphed.check_invariants()
