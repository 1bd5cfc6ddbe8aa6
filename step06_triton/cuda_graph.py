"""Replay whole forwards as CUDA graphs: a small model's step is launch-bound.

Chapter 1's layer launches ~40 small kernels (RMSNorm alone is eight), so a SmolLM2-135M step is over a thousand
launches of a few microseconds each, while the arithmetic of 64 decode tokens needs far less. Captured once, the
step becomes one `graph.replay()`. A graph replays fixed addresses and shapes, so (as vLLM's CUDA-graph runner and
SGLang's `cuda_graph_runner.py` do) we keep static input buffers, capture one graph per padded size, copy each
step's inputs into the buffers and pad: padding rows store nowhere (slot -1), and their outputs are not read.
The graph reads the engine's persistent block table in place (the step's `rows` pick its rows inside the graph).

Two kinds of graphs:
- **decode**, one per padded batch size: every row is one sequence's next token; the graph also computes the
  LM head, so a replayed decode step hands back every row's logits;
- **extend**, one per padded token count (up to `max_extend`): a single sequence's chunk after its cached prefix —
  a prompt that hits the prefix cache and has a few tokens left, the write-up's `long` benchmark. Padding rows
  come after the real ones, so the causal mask keeps every real row from seeing them.
Other steps (long prefills, mixed batches) run eagerly. `CUDAGraphModel` wraps the model the engine calls; the
engine does not know graphs exist.
"""
from __future__ import annotations

import contextlib

import torch

from step01_kvcache.model import Transformer

from .decode_attention import num_kv_splits
from .fusion import fused_decode
from .triton_attention import TritonMetadata, TritonPagedAttention

BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
EXTEND_SIZES = (16, 32, 64, 128, 256)


class CUDAGraphModel:
    """The engine's model, with decode steps and short single-sequence chunks replayed from CUDA graphs."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.graphs: dict[tuple[str, int], torch.cuda.CUDAGraph] = {}
        self.replays = 0  # steps served by a graph (the rest ran eagerly)
        self.timings: list | None = None  # set to a list to get (start, end) CUDA events around every replay
        self._replayed: torch.Tensor | None = None  # the hidden states the last decode replay returned

    # the engine reads these from its model
    config = property(lambda self: self.model.config)
    device = property(lambda self: self.model.device)
    dtype = property(lambda self: self.model.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head; for the rows a decode replay just returned, the logits the graph already computed."""
        if hidden is self._replayed:
            return self.logits[: hidden.shape[0]]
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self, engine, max_batch: int | None = None, max_extend: int = EXTEND_SIZES[-1],
                fuse: bool = False) -> None:
        """Decode graphs up to `max_batch` sequences (default: the engine's seats) and extend graphs up to
        `max_extend` tokens, reading `engine`'s pool and block table. `fuse` captures the fused step (fusion.py:
        q/k/v and gate/up one product each, compiled RMSNorm and SwiGLU); eager steps keep chapter 1's code."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need the model on a CUDA device")
        n = max(max_batch or engine.config.max_num_seqs, max_extend)
        dev, cfg = self.device, self.config
        self.pool, self.table = engine.pool, engine.block_table.device_table
        self.max_batch, self.max_extend = max_batch or engine.config.max_num_seqs, max_extend
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)  # int32: fewer registers in the kernels
        self.rows = torch.zeros(n, dtype=torch.long, device=dev)
        self.query_start_loc = torch.zeros(2, dtype=torch.long, device=dev)
        self.hidden = torch.zeros(n, cfg.hidden_size, dtype=self.dtype, device=dev)
        self.logits = torch.zeros(self.max_batch, cfg.vocab_size, dtype=self.dtype, device=dev)
        self.decode_sizes = [b for b in BATCH_SIZES if b < self.max_batch] + [self.max_batch]
        self.extend_sizes = [t for t in EXTEND_SIZES if t < max_extend] + [max_extend]
        kinds = [("decode", b) for b in reversed(self.decode_sizes)] + [("extend", t) for t in self.extend_sizes]
        mempool = torch.cuda.graph_pool_handle()  # all graphs share one memory pool (they never run at once)
        with fused_decode(self.model) if fuse else contextlib.nullcontext([]) as fused_weights:
            self.fused_weights = fused_weights  # the graphs read them: they live as long as the graphs
            for kind, size in kinds:
                self._forward(kind, size)  # compile the kernels and warm up outside the capture (slot -1)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=mempool):
                    self._forward(kind, size)
                self.graphs[kind, size] = graph

    def _forward(self, kind: str, size: int) -> None:
        """The captured computation: a decode batch of `size` rows, or one sequence's chunk of `size` tokens."""
        rows = size if kind == "decode" else 1
        table = self.table.index_select(0, self.rows[:rows])
        if kind == "decode":
            splits = num_kv_splits(self.config.max_position_embeddings)  # the grid of the longest context
            md = TritonMetadata(self.slot_mapping[:size], table, self.seq_lens[:size], self.query_start_loc[:1],
                                size, 0, splits)
        else:
            md = TritonMetadata(self.slot_mapping[:size], table, self.seq_lens[:1], self.query_start_loc, 0, size, 1)
        hidden = self.model(self.input_ids[:size], self.positions[:size], TritonPagedAttention(self.pool, md))
        self.hidden[:size].copy_(hidden)
        if kind == "decode":
            self.logits[:size].copy_(self.model.compute_logits(hidden))

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv) -> torch.Tensor:
        n, batch = input_ids.shape[0], getattr(kv, "batch", None)
        self._replayed = None
        if not self.graphs or batch is None:
            return self.model(input_ids, positions, kv)
        if batch.num_decodes == n and n <= self.max_batch:
            kind, size = "decode", next(b for b in self.decode_sizes if b >= n)
        elif batch.num_seqs == 1 and n <= self.max_extend:
            kind, size = "extend", next(t for t in self.extend_sizes if t >= n)
            if batch.max_seq_len + size - n > self.config.max_position_embeddings:  # padding past the table's end
                return self.model(input_ids, positions, kv)
        else:
            return self.model(input_ids, positions, kv)
        rows = n if kind == "decode" else 1
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(batch.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        self.rows[:rows].copy_(batch.rows)
        if kind == "decode":
            self.seq_lens[:n].copy_(batch.seq_lens)
            self.seq_lens[n:size].fill_(1)
        else:  # pad the chunk to `size` rows: the context grows by the padding, which no real row can see
            self.seq_lens[:1].copy_(batch.seq_lens + (size - n))
            self.query_start_loc[1] = size
        if self.timings is None:
            self.graphs[kind, size].replay()
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.graphs[kind, size].replay()
            end.record()
            self.timings.append((start, end))
        self.replays += 1
        if kind == "decode":
            self._replayed = self.hidden[:n]
            return self._replayed
        return self.hidden[:n]
