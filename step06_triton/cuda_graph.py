"""Replay whole forwards as CUDA graphs: a small model's step is launch-bound.

Chapter 1's layer launches ~40 small kernels (RMSNorm alone is eight), so a SmolLM2-135M step is over a thousand
launches of a few microseconds each, while the arithmetic of 64 decode tokens needs far less. Captured once, the
step becomes one `graph.replay()`. A graph replays fixed addresses and shapes, so (as vLLM's CUDA-graph runner and
SGLang's `cuda_graph_runner.py` do) we keep static input buffers, capture one graph per padded size, copy each
step's inputs into the buffers and pad: padding rows store nowhere (slot -1), and their outputs are not read.
The graph reads the engine's persistent block table in place (the step's `rows` pick its rows inside the graph).

Two kinds of graphs:
- **decode**, one per padded batch size and split axis (plain decode attention, and with `cascade_min_seqs` also
  cascade attention): every row is one sequence's next token; the graph also
  computes the LM head, so a replayed decode step hands back every row's logits. The attention's grid is frozen
  too, so each batch size is captured with a few split axes (`split_buckets`: 1, 4, 16 ... splits per sequence)
  and a step replays the smallest that holds its longest context: a batch of short contexts launches no idle
  split programs and no merge, a long one gets all the splits it needs;
- **extend**, one per padded token count (up to `max_extend`): a single sequence's chunk after its cached prefix —
  a prompt that hits the prefix cache and has a few tokens left, the write-up's `long` benchmark — or a whole
  prompt of a few thousand tokens, a cold request, which would otherwise launch its ~1,000 kernels one by one.
  Padding rows come after the real ones, so the causal mask keeps every real row from seeing them. The graph
  also computes the logits of the chunk's last real row (its index a static buffer), the one a finished prompt
  samples, so a warm request launches no gather and LM head after the replay.
Other steps (long prefills, mixed batches) run eagerly. `CUDAGraphRunner` is the engine's runner (chapter 2's
`ModelRunner` contract: a `ForwardBatch` in, the logits of its sampled rows out), so the engine does not know graphs
exist; the graphs read the pool and the engine's persistent block table, which `capture` is given.
"""
from __future__ import annotations

import contextlib
from collections import Counter

import torch

from step01_kvcache.model import Transformer
from step02_paged.attention_backend import AttentionBackend
from step02_paged.forward_batch import ForwardBatch
from step02_paged.kv_pool import KVPool
from step02_paged.model_runner import ModelRunner

from .cascade import CascadeGrid, CascadeMetadata, cascade_suffix_lens
from .decode_attention import split_bucket, split_buckets
from .fusion import fused_decode
from .triton_attention import TritonMetadata, TritonPagedAttention

BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# one sequence's chunk, padded up to the next of these: powers of two to 256, then steps of a quarter of the size
# or less, so that padding costs at most a quarter of a long prefill (a cold request's whole prompt is one chunk)
EXTEND_SIZES = (16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096)


class CUDAGraphRunner(ModelRunner):
    """Decode steps and short single-sequence chunks replayed from CUDA graphs; every other step runs eagerly."""

    def __init__(self, model: Transformer, attention: AttentionBackend, pool: KVPool, fuse: bool = False) -> None:
        super().__init__(model, attention, pool)
        self.fuse = fuse  # capture the fused step (fusion.py); eager steps keep chapter 1's code
        self.graphs: dict[tuple[str, int, int], torch.cuda.CUDAGraph] = {}  # (kind, size, split axis) -> graph
        self.replayed: Counter[tuple[str, int, int]] = Counter()  # steps each graph (kind, size, axis) served
        self.timings: list | None = None  # set to a list to get (start, end) CUDA events around every replay

    @torch.inference_mode()
    def capture(self, block_table: torch.Tensor, max_batch: int, max_extend: int = EXTEND_SIZES[-1],
                cascade_min_seqs: int | None = None) -> None:
        """Decode graphs up to `max_batch` sequences and extend graphs up to `max_extend` tokens, reading the pool
        and `block_table`, the engine's persistent block table on the device. With `fuse`, the graphs hold the fused
        step (fusion.py: q/k/v and gate/up one product each, compiled RMSNorm and SwiGLU). Each decode batch size is
        captured on every split axis of `split_buckets`. With `cascade_min_seqs`, also cascade-attention decode
        graphs per batch size (and axis) from that many rows on: their work lists are static buffers of fixed sizes
        (`CascadeGrid`), refreshed before each replay."""
        if self.model.device.type != "cuda":
            raise RuntimeError("CUDA graphs need the model on a CUDA device")
        keys = self.static_buffers(block_table, max_batch, max_extend, cascade_min_seqs)
        mempool = torch.cuda.graph_pool_handle()  # all graphs share one memory pool (they never run at once)
        weights: contextlib.AbstractContextManager[list] = fused_decode(self.model) if self.fuse else \
            contextlib.nullcontext([])
        with weights as fused_weights:
            self.fused_weights = fused_weights  # the graphs read them: they live as long as the graphs
            for key in keys:
                self._forward(*key)  # compile the kernels and warm up outside the capture (slot -1)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=mempool):
                    self._forward(*key)
                self.graphs[key] = graph

    @torch.inference_mode()  # inference tensors, as the engine's steps make: a compiled model's guards tell them apart
    def static_buffers(self, block_table: torch.Tensor, max_batch: int, max_extend: int,
                       cascade_min_seqs: int | None) -> list[tuple[str, int, int]]:
        """Allocate the buffers every graph reads and writes (the step's inputs, the hidden rows, the logits, the
        cascade work lists); returns the graphs to capture (kind, size, split axis), in the order to capture them."""
        n = max(max_batch, max_extend)
        dev, cfg, dtype = self.model.device, self.model.config, self.model.dtype
        self.table = block_table
        self.max_batch, self.max_extend = max_batch, max_extend
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)  # int32: fewer registers in the kernels
        self.rows = torch.zeros(n, dtype=torch.long, device=dev)
        self.query_start_loc = torch.zeros(2, dtype=torch.long, device=dev)
        self.hidden = torch.zeros(n, cfg.hidden_size, dtype=dtype, device=dev)
        self.logits = torch.zeros(self.max_batch, cfg.vocab_size, dtype=dtype, device=dev)
        self.last_row = torch.zeros(1, dtype=torch.long, device=dev)  # an extend step's last real row
        self.decode_sizes = [b for b in BATCH_SIZES if b < self.max_batch] + [self.max_batch]
        self.extend_sizes = [t for t in EXTEND_SIZES if t < max_extend] + [max_extend]
        self.split_axes = split_buckets(cfg.max_position_embeddings)
        keys = [("decode", b, s) for b in reversed(self.decode_sizes) for s in self.split_axes]
        keys += [("extend", t, 0) for t in self.extend_sizes]
        self.cascades: dict[tuple[int, int], CascadeMetadata] = {}  # (batch, split axis) -> its graph's work lists
        if cascade_min_seqs:
            heads, kv_heads = cfg.num_heads, cfg.num_kv_heads
            for b in self.decode_sizes:
                for s in self.split_axes if b >= cascade_min_seqs else ():
                    grid = CascadeGrid.for_batch(b, heads // kv_heads, cascade_min_seqs, cfg.head_dim, splits=s)
                    self.cascades[b, s] = CascadeMetadata.build([], [1] * b, heads, kv_heads, cfg.head_dim, dev,
                                                                grid=grid)
                    keys.insert(0, ("cascade", b, s))
        return keys

    def _forward(self, kind: str, size: int, splits: int) -> None:
        """The captured computation: a decode batch of `size` rows whose attention grid has `splits` splits per
        sequence, or one sequence's chunk of `size` tokens."""
        rows = 1 if kind == "extend" else size
        table = self.table.index_select(0, self.rows[:rows])
        if kind == "extend":
            md = TritonMetadata(self.slot_mapping[:size], table, self.seq_lens[:1], self.query_start_loc, 0, size, 1)
        else:
            md = TritonMetadata(self.slot_mapping[:size], table, self.seq_lens[:size], self.query_start_loc[:1],
                                size, 0, splits)
        store = TritonPagedAttention(self.pool, md, self.cascades.get((size, splits)) if kind == "cascade" else None)
        hidden = self.model(self.input_ids[:size], self.positions[:size], store)
        self.hidden[:size].copy_(hidden)
        if kind == "extend":  # the row a finished prompt samples: no eager gather and LM head after the replay
            self.logits[:1].copy_(self.model.compute_logits(hidden.index_select(0, self.last_row)))
        else:
            self.logits[:size].copy_(self.model.compute_logits(hidden))

    def _graph_for(self, batch: ForwardBatch) -> tuple[str, int, int] | None:
        """The captured graph that can run this step, if any: a decode batch (on the smallest split axis that
        holds its longest context, or for a cascade its longest suffix), or one short chunk whose padded context
        stays inside the block table."""
        n = batch.num_tokens
        if not self.graphs:
            return None
        if batch.num_decodes == n and n <= self.max_batch:
            size = next(b for b in self.decode_sizes if b >= n)
            if batch.cascade:
                suffix = cascade_suffix_lens(batch.cascade, batch.context_lens)
                splits = split_bucket(self.split_axes, int(suffix.max()))
                if (size, splits) in self.cascades:
                    return "cascade", size, splits
            return "decode", size, split_bucket(self.split_axes, batch.max_seq_len)
        if batch.num_seqs == 1 and n <= self.max_extend:
            size = next(t for t in self.extend_sizes if t >= n)
            if batch.max_seq_len + size - n <= self.model.config.max_position_embeddings:
                return "extend", size, 0
        return None

    @property
    def replays(self) -> int:
        """Steps served by a graph (the rest ran eagerly)."""
        return sum(self.replayed.values())

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits of the batch's sampled rows: from a graph replay when one fits, else from the eager forward."""
        graph = self._graph_for(batch)
        if graph is None:
            return super().forward(batch)
        kind, size, splits = graph
        n = batch.num_tokens
        rows = 1 if kind == "extend" else n
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.slot_mapping[:n].copy_(batch.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        self.rows[:rows].copy_(batch.rows)
        if kind != "extend":
            self.seq_lens[:n].copy_(batch.seq_lens)
            self.seq_lens[n:size].fill_(1)
        if kind == "cascade":  # this step's work lists, padded to the sizes the graph was captured with
            static = self.cascades[size, splits]
            lens = batch.context_lens + [1] * (size - n)
            cfg = self.model.config
            md = CascadeMetadata.build(batch.cascade, lens, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                       static.flat.device, grid=static.grid)
            static.flat.copy_(md.flat)
        elif kind == "extend":  # the chunk padded to `size` rows: the context grows by padding no real row sees
            self.seq_lens[:1].copy_(batch.seq_lens + (size - n))
            self.query_start_loc[1:].fill_(size)  # a kernel: setting an item from the host would wait for the GPU
            self.last_row.fill_(n - 1)
        if self.timings is None:
            self.graphs[graph].replay()
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.graphs[graph].replay()
            end.record()
            self.timings.append((start, end))
        self.replayed[graph] += 1
        if kind != "extend":  # a decode step: every row samples, and the graph computed their logits
            return self.logits[:n]
        if batch.logits_indices.shape[0] == 1:  # a prompt's last chunk samples its last row: the graph's logits
            return self.logits[:1]
        # a chunk that samples no row (the prompt goes on) or several (a verify step's drafts): from the hidden rows
        return self.model.compute_logits(self.hidden[:n][batch.logits_indices])
