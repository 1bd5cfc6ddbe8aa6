"""Fewer, larger kernels for the captured decode step, without touching chapter 1's model.

A decode step of a small model is a long chain of small kernels: chapter 1's layer projects q, k and v with three
matrix products that read the same input, gate and up with two more, rotates q and k in ten elementwise kernels,
adds each residual in one and computes RMSNorm in eight. On a GPU each is a launch and a pass over memory.
Concatenating weights that read the same input turns three products into one (vLLM's `QKVParallelLinear`,
`MergedColumnParallelLinear`); compiling the elementwise chains fuses each into one kernel; and a residual add
meets the RMSNorm that follows it in one kernel (vLLM's `fused_add_rms_norm`), which takes arranging the model's
forward so that each layer's last add is done together with the next layer's first norm (`fused_forward`: chapter
1's computation, in that order). `fused_decode` does all of it while a CUDA graph is captured and undoes it after,
so the graph keeps the fused kernels and eager steps (prefill) still run chapter 1's code.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from step01_kvcache import attention as attention_module
from step01_kvcache.attention import Attention
from step01_kvcache.layers import MLP, RMSNorm
from step01_kvcache.model import Transformer
from step01_kvcache.rope import apply_rotary


class SharedProjection:
    """Stands in for one of several Linear layers that read the same input: the first call on an input computes
    all their outputs with one product over the concatenated weights, the others return their slice of it."""

    def __init__(self, fused: dict, start: int, end: int) -> None:
        self.fused, self.start, self.end = fused, start, end

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION task6.fuse points=2
        if self.fused.get("input") is not x:
            self.fused["input"], self.fused["output"] = x, F.linear(x, self.fused["weight"])
        return self.fused["output"][..., self.start: self.end]
        # END SOLUTION


def share_projections(module: nn.Module, names: tuple[str, ...]) -> torch.Tensor:
    """Shadow `module.<name>` (Linear layers without bias, same input) by slices of one fused product. Returns the
    fused weight."""
    layers = [getattr(module, n) for n in names]
    # BEGIN SOLUTION task6.fuse points=2
    fused = {"weight": torch.cat([layer.weight for layer in layers])}
    start = 0
    for name, layer in zip(names, layers):
        module.__dict__[name] = SharedProjection(fused, start, start + layer.out_features)  # found before _modules
        start += layer.out_features
    return fused["weight"]
    # END SOLUTION


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation over the fused gate/up output: silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotate_together(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 1's `apply_rotary` over q and k side by side ([T, Hq + Hkv, D]): compiled, one kernel writing one
    tensor, where two outputs of different shapes compile to two kernels. Returns views of it."""
    qk, _ = apply_rotary(torch.cat((q, k), dim=1), k[:, :0], cos, sin)
    return qk.split((q.shape[1], k.shape[1]), dim=1)


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """A residual add and the RMSNorm that reads its result: (x + y, norm(x + y)), one kernel once compiled."""
    s = x + y
    return s, RMSNorm.forward(norm, s)


def fused_forward(model: Transformer, input_ids: torch.Tensor, positions: torch.Tensor, kv=None, norm=RMSNorm.forward,
                  add_norm=add_rms_norm) -> torch.Tensor:
    """Chapter 1's `Transformer.forward`, each residual add done together with the RMSNorm after it (the next
    layer's input norm, or the final norm): `norm(module, x)` and `add_norm(x, y, module)` may be compiled."""
    x = model.embed_tokens(input_ids)
    rope = model.rope(positions, x.dtype)
    layers = model.layers
    h = norm(layers[0].input_layernorm, x)
    for i, layer in enumerate(layers):
        x, h = add_norm(x, layer.self_attn(h, positions, rope, kv), layer.post_attention_layernorm)
        after = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.norm
        x, h = add_norm(x, layer.mlp(h), after)
    return h


@contextlib.contextmanager
def fused_decode(model: Transformer, compile_pointwise: bool = True) -> Iterator[list]:
    """Within the block: q/k/v one product, gate/up one product, the model's forward in `fused_forward`'s order and
    (compiled with torch.compile) RMSNorm, residual add + RMSNorm, RoPE of q and k and SwiGLU's activation one kernel
    each.
    Chapter 1's code comes back on exit. Yields what the fused step uses (the fused weights, the compiled functions):
    a CUDA graph captured inside reads them, so whoever keeps the graph must keep them too."""
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    mlps = [m for m in model.modules() if isinstance(m, MLP)]
    compiled = torch.compile if compile_pointwise else (lambda fn: fn)
    act, norm, add_norm, rotate = (compiled(fn) for fn in (silu_and_mul, RMSNorm.forward, add_rms_norm,
                                                           rotate_together))
    weights: list = [act, norm]
    try:
        for m in attentions:
            weights.append(share_projections(m, ("q_proj", "k_proj", "v_proj")))
        for m in mlps:
            weights.append(torch.cat([m.gate_proj.weight, m.up_proj.weight]))
            m.forward = lambda x, m=m, w=weights[-1]: m.down_proj(act(F.linear(x, w)))  # shadows MLP.forward
        model.forward = functools.partial(fused_forward, model, norm=norm, add_norm=add_norm)
        attention_module.apply_rotary = rotate  # what chapter 1's Attention.forward calls by name
        yield weights
    finally:
        attention_module.apply_rotary = apply_rotary
        for m in attentions:
            for name in ("q_proj", "k_proj", "v_proj"):
                m.__dict__.pop(name, None)  # the registered Linear layers are found again
        for m in mlps:
            m.__dict__.pop("forward", None)
        model.__dict__.pop("forward", None)
