"""Replay the whole decode forward as one CUDA graph: a small model's decode step is launch-bound.

Chapter 1's layer launches ~40 small kernels (RMSNorm alone is eight), so a SmolLM2-135M step is over a thousand
launches of a few microseconds each, while the arithmetic of 64 decode tokens needs far less. Captured once, the
step becomes one `graph.replay()`. A graph replays fixed addresses and shapes, so (as vLLM's CUDA-graph runner and
SGLang's `cuda_graph_runner.py` do) we keep static input buffers, capture one graph per padded batch size, copy
each step's inputs into the buffers and pad the batch: padding rows store nowhere (slot -1) and attend over a
one-token context. Prefill steps, and batches larger than the largest graph, run eagerly.

`CUDAGraphModel` wraps the model the engine calls; the engine does not know graphs exist.
"""
from __future__ import annotations

import functools

import torch

from step01_kvcache.layers import MLP, RMSNorm
from step01_kvcache.model import Transformer
from step02_paged.kv_pool import KVPool

from .decode_attention import default_num_splits
from .triton_attention import TritonMetadata, TritonPagedAttention

BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


class CUDAGraphModel:
    """The engine's model, with decode-only steps on `TritonPagedAttention` replayed from CUDA graphs."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.replays = 0  # decode steps served by a graph (the rest ran eagerly)

    # the engine reads these from its model
    config = property(lambda self: self.model.config)
    device = property(lambda self: self.model.device)
    dtype = property(lambda self: self.model.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self, pool: KVPool, max_batch: int, max_context: int, fuse_pointwise: bool = False) -> None:
        """One graph per padded batch size up to `max_batch`, for contexts up to `max_context` tokens.

        A graph removes launch gaps, not launches: chapter 1's RMSNorm is 8 small kernels and SwiGLU 5, so a
        step still runs ~40 kernels per layer. `fuse_pointwise` captures with those two modules' forwards
        compiled by torch.compile, which fuses each elementwise chain into one kernel; the graphs keep the
        fused kernels, and the modules are restored afterwards, so eager (prefill) steps run chapter 1's code."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need the model on a CUDA device")
        fused = [m for m in self.model.modules() if isinstance(m, (RMSNorm, MLP))] if fuse_pointwise else []
        compiled = {cls: torch.compile(cls.forward) for cls in {type(m) for m in fused}}  # one graph per class
        for module in fused:
            module.forward = functools.partial(compiled[type(module)], module)  # shadows the class's forward
        try:
            self._capture_all(pool, max_batch, max_context)
        finally:
            for module in fused:
                del module.forward

    def _capture_all(self, pool: KVPool, max_batch: int, max_context: int) -> None:
        self.pool, self.max_batch = pool, max_batch
        n, width = max_batch, -(-max_context // pool.block_size)
        dev = self.device
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.block_table = torch.zeros(n, width, dtype=torch.long, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.long, device=dev)
        self.hidden = torch.zeros(n, self.config.hidden_size, dtype=self.dtype, device=dev)
        self.sizes = [b for b in BATCH_SIZES if b < max_batch] + [max_batch]
        mempool = torch.cuda.graph_pool_handle()  # all graphs share one memory pool (they never run at once)
        for bs in reversed(self.sizes):  # largest first, so the pool is sized once
            md = TritonMetadata(self.positions[:bs], self.slot_mapping[:bs], self.block_table[:bs], self.seq_lens[:bs],
                                torch.zeros(1, dtype=torch.long, device=dev), bs, 0,
                                default_num_splits(bs, pool.k.shape[-2], max_context))
            self._forward(bs, md)  # compile the kernels and warm up outside the capture (slot -1: nothing stored)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=mempool):
                self._forward(bs, md)
            self.graphs[bs] = graph

    def _forward(self, bs: int, md: TritonMetadata) -> None:
        kv = TritonPagedAttention(self.pool, md)
        self.hidden[:bs].copy_(self.model(self.input_ids[:bs], self.positions[:bs], kv))

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv) -> torch.Tensor:
        n = input_ids.shape[0]
        md = getattr(kv, "md", None)
        if (not self.graphs or not isinstance(kv, TritonPagedAttention) or md.num_decodes != n or n > self.max_batch
                or md.block_table.shape[1] > self.block_table.shape[1]):
            return self.model(input_ids, positions, kv)
        bs = next(b for b in self.sizes if b >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(md.slot_mapping)
        self.slot_mapping[n:bs].fill_(-1)
        self.seq_lens[:n].copy_(md.seq_lens)
        self.seq_lens[n:bs].fill_(1)
        self.block_table[:n, : md.block_table.shape[1]].copy_(md.block_table)
        self.graphs[bs].replay()
        self.replays += 1
        return self.hidden[:n]
