"""The KVStore of chapter 1, on chapter 2's pool, with the three kernels: a drop-in for `PagedAttention`.

Per engine step the flat batch is [decodes | prefill chunks] (the engine puts single-token sequences first).
Everything the kernels need is already on the device in the step's `ForwardBatch` (built on the host in
O(what the step runs), copied once); `TritonMetadata` only picks and slices it — no host work per sequence, no
host-device synchronisation. Every layer then runs three launches: `store_kvcache` for all rows,
`paged_decode_attention` (or cascade.py's `cascade_decode_attention`) for the decode rows, `extend_attention` for
the chunk rows; the last two add a merge of their splits' partial results when they split. Chapter 2 gathered every
context into a padded [B, max_context] tensor first; here no K/V byte is copied — the kernels read the pool
through the block table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from step02_paged.attention_backend import AttentionBackend
from step02_paged.forward_batch import CascadeGroup, ForwardBatch
from step02_paged.kv_pool import KVPool

from .cascade import CascadeMetadata, cascade_decode_attention
from .decode_attention import Partials, num_kv_splits, paged_decode_attention
from .extend_attention import extend_attention
from .store_kvcache import store_kvcache


@dataclass(frozen=True)
class TritonMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V goes; -1 = nowhere (graph padding)
    block_table: torch.Tensor  # [B, max_blocks] the step's rows of the persistent block table
    seq_lens: torch.Tensor  # [B] tokens in the context after this step
    query_start_loc: torch.Tensor  # [B - num_decodes + 1] chunk rows, relative to the first chunk row
    num_decodes: int  # rows 0 .. num_decodes - 1 are single-token sequences
    max_query_len: int  # longest chunk (sizes the extend grid)
    max_splits: int  # the decode grid's split axis (each sequence's own split count is decided on the device)
    cascade: tuple[CascadeGroup, ...] = ()  # decode rows that read a shared prefix once (cascade.py)
    decode_lens: tuple[int, ...] = ()  # host copies of the decode rows' contexts (for the cascade's work lists)
    max_prefix_len: int | None = None  # the chunks' longest cached prefix (the extend split rule; None: the table's)

    @classmethod
    def from_batch(cls, batch: ForwardBatch) -> TritonMetadata:
        """Views of the batch's device tensors; the grid's split bound from a host-side length (never read back);
        the batch's cascade groups, if its engine holds a cascade policy."""
        d = batch.num_decodes
        chunks = batch.num_new[d:]
        decode_lens = tuple(batch.context_lens[:d])
        max_splits = num_kv_splits(max(decode_lens)) if d else 1
        qsl = batch.query_start_loc[d:] - batch.query_start_loc[d]
        return cls(batch.slot_mapping, batch.block_tables(), batch.seq_lens.to(torch.int32), qsl, d,
                   max(chunks, default=0), max_splits, batch.cascade, decode_lens,
                   max(batch.num_computed[d:], default=0))


class TritonPagedAttention:
    """A KVStore (see step01_kvcache.attention) over a KVPool, computed by the Triton kernels."""

    def __init__(self, pool: KVPool, metadata: TritonMetadata, cascade: CascadeMetadata | None = None) -> None:
        self.pool, self.md = pool, metadata
        self.cascade = cascade  # the cascade's work lists: given (a CUDA graph's), or made at the first layer
        self.partials: Partials | None = None  # the decode's merge slots, allocated once for all layers

    @classmethod
    def for_step(cls, pool: KVPool, batch: ForwardBatch) -> TritonPagedAttention:
        return cls(pool, TritonMetadata.from_batch(batch))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        md, k_cache, v_cache = self.md, self.pool.k[layer], self.pool.v[layer]
        scales = self.pool.layer_scales(layer)  # an FP8 pool's, or None
        store_kvcache(k, v, k_cache, v_cache, md.slot_mapping, scales)
        out = torch.empty_like(q)
        d = md.num_decodes
        if d and (md.cascade or self.cascade is not None):
            if self.cascade is None:  # one build per step, on the host, in one copy; every layer reads it
                self.cascade = CascadeMetadata.build(md.cascade, md.decode_lens, q.shape[1], k.shape[1], q.shape[2],
                                                     q.device)
            cascade_decode_attention(q[:d], k_cache, v_cache, md.block_table[:d], self.cascade, out=out[:d],
                                     kv_scales=scales)
        elif d:
            if self.partials is None:
                self.partials = Partials.empty(d, q.shape[1], q.shape[2], md.max_splits, q.device)
            paged_decode_attention(q[:d], k_cache, v_cache, md.block_table[:d], md.seq_lens[:d], md.max_splits,
                                   out=out[:d], partials=self.partials, kv_scales=scales)
        if d < q.shape[0]:
            extend_attention(q[d:], k_cache, v_cache, md.block_table[d:], md.query_start_loc, md.seq_lens[d:],
                             md.max_query_len, out=out[d:], max_prefix_len=md.max_prefix_len, kv_scales=scales)
        return out.view(q.shape[0], -1)


if TYPE_CHECKING:  # the contract, checked by mypy (make test)
    _backend: AttentionBackend = TritonPagedAttention
