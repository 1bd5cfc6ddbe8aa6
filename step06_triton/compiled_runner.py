"""The model compiled by `torch.compile` (Inductor), attention a custom op that the graph does not look into.

fusion.py fused a decode step by hand, one fusion at a time (q/k/v one product, residual add + RMSNorm one kernel).
A compiler finds the same fusions by itself, if it can see the model's code: everything but the attention, whose
kernels are our own (Triton, or chapter 2's torch code) and read state that is not a tensor argument (the step's
block table and slots, and the pool that it writes). So, as vLLM does, attention becomes one custom operator:
- `kvcourse::attend(q, k, v, layer)` is registered with `torch.library.custom_op`, with a fake implementation
  (the output's shape and dtype, no work) so that the compiler can trace through it; the compiled graph calls it as
  an opaque function, one call per layer;
- the op reads the step's attention store (chapter 2's `StepAttention`, whatever backend made it) from a per-forward
  context that the runner sets around each forward (`forward_context`): the graph's inputs stay the token ids and
  positions. vLLM's runner does the same with `set_forward_context(...)`, and its attention layer calls
  `torch.ops.vllm.unified_attention*`, a custom op that reads the metadata and the layer's KV cache from
  `get_forward_context()`.
The op declares no mutated argument: the pool it writes is not an argument. Nothing can reorder or drop a call, since
each layer's output feeds the next layer and the step's logits.

As vLLM's model files hold them, q, k and v are one product over concatenated weights, and gate and up another
(`merge`, the default: `MergedModel`, which runs chapter 1's forward code over merged modules); the compiler cannot
merge products by itself (it fuses elementwise work, not matrix products that read one input). The merged weights
are copies made once, as fusion.py's are.

The token count changes every step (decode batches, prefill chunks), so the graph is compiled once with a symbolic
token dimension, not once per size: a compile takes seconds even for the tests' two-layer model on a CPU (the GPU
measurement reports it for the real shapes, `compile_s`), and there are over twenty padded decode and chunk sizes.
The dimension is marked *unbacked* (`mark_unbacked`): a plain dynamic dimension (`mark_dynamic`) is specialized at
sizes 0 and 1, so the first single-token step would compile the model a second time. One compiled model per (model,
backend, dynamic, merge) per process: every engine built on the same model shares it (`compiled_model`), and Dynamo
reuses the graph for another model of the same shapes and dtype (the weights are the graph's inputs).

On a GPU the runner is chapter 6's `CUDAGraphRunner` with the compiled forward inside: `capture` records the compiled
step per decode batch-size bucket (and split axis) and per extend size, in the same static buffers; any other step
runs the compiled forward without a graph. On a CPU there are no graphs and every step runs the compiled forward.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from step01_kvcache.attention import Attention, KVStore
from step01_kvcache.layers import MLP
from step01_kvcache.model import DecoderLayer, Transformer
from step01_kvcache.rope import apply_rotary
from step02_paged.attention_backend import AttentionBackend
from step02_paged.kv_pool import KVPool

from .cuda_graph import CUDAGraphRunner
from .fusion import silu_and_mul

_step_store: list[KVStore] = []  # the forward in progress's attention store (set by `forward_context`)


@contextlib.contextmanager
def forward_context(store: KVStore) -> Iterator[None]:
    """Within the block, `kvcourse::attend` attends through `store` (this step's)."""
    _step_store.append(store)
    try:
        yield
    finally:
        _step_store.pop()


@torch.library.custom_op("kvcourse::attend", mutates_args=())
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """The step's store of `layer`: store k, v [T, Hkv, D] into the pool, attend q [T, Hq, D]; [T, Hq * D]."""
    if not _step_store:
        raise RuntimeError("kvcourse::attend ran outside a forward_context: no step's attention store to read")
    return _step_store[-1].attend(layer, q, k, v)


@attend.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


class OpStore:
    """The KV store the compiled graph sees: every layer's attention is one call of the custom op."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.ops.kvcourse.attend(q, k, v, layer)


class NoAttention:
    """The store of the compile's warm-up forward: zeros, nothing stored (it reads no pool)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return q.new_zeros(q.shape[0], q.shape[1] * q.shape[2])


class MergedAttention(nn.Module):
    """Chapter 1's `Attention` with q, k and v one product over their concatenated weights (vLLM's
    `QKVParallelLinear`); o_proj, the heads and the layer index are the module's own."""

    qkv_weight: torch.Tensor

    def __init__(self, attn: Attention) -> None:
        super().__init__()
        self.attn = attn
        weights = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]
        self.register_buffer("qkv_weight", torch.cat(weights).detach(), persistent=False)
        self.sizes = [w.shape[0] for w in weights]

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv: KVStore) -> torch.Tensor:
        a, T = self.attn, x.shape[0]
        q, k, v = F.linear(x, self.qkv_weight).split(self.sizes, dim=-1)
        q, k = apply_rotary(q.view(T, a.num_heads, a.head_dim), k.view(T, a.num_kv_heads, a.head_dim), *rope)
        return a.o_proj(kv.attend(a.layer, q, k, v.view(T, a.num_kv_heads, a.head_dim)))


class MergedMLP(nn.Module):
    """Chapter 1's `MLP` with gate and up one product (vLLM's `MergedColumnParallelLinear`)."""

    gate_up_weight: torch.Tensor

    def __init__(self, mlp: MLP) -> None:
        super().__init__()
        self.mlp = mlp
        self.register_buffer("gate_up_weight", torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp.down_proj(silu_and_mul(F.linear(x, self.gate_up_weight)))


class MergedLayer(nn.Module):
    """A decoder layer over the merged modules: chapter 1's `DecoderLayer.forward`, its norms the layer's own."""

    forward = DecoderLayer.forward

    def __init__(self, layer: DecoderLayer) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = layer.input_layernorm, layer.post_attention_layernorm
        self.self_attn, self.mlp = MergedAttention(layer.self_attn), MergedMLP(layer.mlp)


class MergedModel(nn.Module):
    """Chapter 1's `Transformer.forward` over merged layers; embedding, RoPE and final norm the model's own."""

    forward = Transformer.forward

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.embed_tokens, self.rope, self.norm = model.embed_tokens, model.rope, model.norm
        self.layers = nn.ModuleList(MergedLayer(cast(DecoderLayer, layer)) for layer in model.layers)


class CompiledModel:
    """Chapter 1's model, its forward compiled; called as the model is (`model(input_ids, positions, kv)`), it sets
    `kv` as the forward's context. `compute_logits` (the LM head, one product) and the model's attributes are the
    model's own."""

    def __init__(self, model: Transformer, backend: str | Callable = "inductor", dynamic: str = "unbacked",
                 merge: bool = True) -> None:
        if dynamic not in ("unbacked", "backed"):
            raise ValueError(f"dynamic must be 'unbacked' or 'backed', got {dynamic!r}")
        self.model, self.backend, self.dynamic, self.merge = model, backend, dynamic, merge
        store = OpStore()
        with torch.no_grad():
            traced = MergedModel(model) if merge else model
        self.compiled = torch.compile(lambda ids, pos: traced(ids, pos, store), backend=backend, fullgraph=True)
        self.compile_seconds = self._compile()

    @torch.inference_mode()  # as the engine's steps run: a forward in another grad mode would compile again
    def _compile(self) -> float:
        """Compile now (one warm-up forward of 8 tokens through `NoAttention`), not in the engine's first step;
        returns the seconds it took."""
        ids = torch.zeros(8, dtype=torch.long, device=self.model.device)
        pos = torch.arange(8, device=self.model.device)
        t0 = time.perf_counter()
        self(ids, pos, NoAttention())
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: KVStore) -> torch.Tensor:
        # the token dimension marked on every call: Dynamo reads the mark only when it compiles, which may happen
        # again (its guards also hold global state: a change of torch's thread count compiles the model again)
        dynamo = torch._dynamo
        mark = dynamo.decorators.mark_unbacked if self.dynamic == "unbacked" else dynamo.maybe_mark_dynamic
        mark(input_ids, 0)
        mark(positions, 0)
        with forward_context(kv):
            return self.compiled(input_ids, positions)

    def __getattr__(self, name: str):  # config, device, dtype, compute_logits, parameters ...: the model's
        if name == "model":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)


def compiled_model(model: Transformer, backend: str = "inductor", dynamic: str = "unbacked",
                   merge: bool = True) -> CompiledModel:
    """The one `CompiledModel` of `model` per backend, dynamic mode and merging in this process (kept on the
    model)."""
    cache = model.__dict__.setdefault("_compiled_forwards", {})
    if (backend, dynamic, merge) not in cache:
        cache[backend, dynamic, merge] = CompiledModel(model, backend, dynamic, merge)
    return cache[backend, dynamic, merge]


class CompiledRunner(CUDAGraphRunner):
    """Chapter 2's runner contract over the compiled model: every step's forward runs the compiled graph; on a GPU,
    after `capture`, decode steps and short chunks replay it from CUDA graphs (cuda_graph.py)."""

    backend, dynamic, merge = "inductor", "unbacked", True  # torch.compile's backend; CompiledModel's options

    def __init__(self, model: Transformer, attention: AttentionBackend, pool: KVPool, backend: str | None = None,
                 dynamic: str | None = None) -> None:
        compiled = compiled_model(model, backend or self.backend, dynamic or self.dynamic, self.merge)
        super().__init__(compiled, attention, pool)  # type: ignore[arg-type]  # called as the model is
        self.compiled = compiled

    @property
    def compile_seconds(self) -> float:
        """Seconds the compile took (once per process: an engine built later on the same model reuses it)."""
        return self.compiled.compile_seconds
