"""Attention over the paged pool: the KV store that replaces chapter 1's contiguous cache.

Per engine step the tokens of all scheduled sequences form one flat batch [T] (`ForwardBatch`).
`AttentionMetadata` is built from it once per step (context slots of every sequence, masks) and shared by all
layers. Sequences with a single new token are attended together as one padded batch — decodes, and also a
prefill chunk that happens to be one token long (vLLM splits by query length the same way); each longer prefill
chunk is attended on its own, with a causal mask offset by its cached context. Gathering every context into a
padded tensor costs O(context) per step: that is this backend's price, which chapter 6's kernels do not pay.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from step01_kvcache.attention import attention

from .attention_backend import AttentionBackend
from .forward_batch import ForwardBatch
from .kv_pool import KVPool
from .slot_mapping import context_slots


@dataclass(frozen=True)
class PrefillSpan:
    start: int  # rows start:end of the flat batch
    end: int
    slots: torch.Tensor  # [context_len] slots of positions 0..context_len-1
    mask: torch.Tensor | None  # [end - start, context_len], True = hidden


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is stored
    num_decodes: int  # the first num_decodes rows are single-token sequences
    decode_slots: torch.Tensor  # [num_decodes, max_context] (empty without decodes)
    decode_mask: torch.Tensor  # [num_decodes, 1, max_context], True = padding beyond a context
    prefills: tuple[PrefillSpan, ...]

    @classmethod
    def build(cls, batch: ForwardBatch) -> AttentionMetadata:
        """Context slots and masks of every sequence of the step, from the batch's block tables."""
        d, device, bs = batch.num_decodes, batch.positions.device, batch.block_size
        tables = batch.block_tables()
        width = max((c + 1 for c in batch.num_computed[:d]), default=0)
        decode_slots = context_slots(tables[:d], width, bs)
        decode_mask = (torch.arange(width, device=device)[None, :] >= batch.seq_lens[:d, None]).unsqueeze(1)
        prefills = []
        start = d
        for i in range(d, batch.num_seqs):
            end, ctx = start + batch.num_new[i], batch.num_computed[i] + batch.num_new[i]
            mask = torch.arange(ctx, device=device)[None, :] > batch.positions[start:end, None]
            prefills.append(PrefillSpan(start, end, context_slots(tables[i: i + 1], ctx, bs)[0], mask))
            start = end
        return cls(batch.slot_mapping, d, decode_slots, decode_mask, tuple(prefills))


class PagedAttention:
    """A KVStore (see step01_kvcache.attention): store this step's K/V into the pool, attend from it."""

    def __init__(self, pool: KVPool, metadata: AttentionMetadata) -> None:
        self.pool, self.md = pool, metadata

    @classmethod
    def for_step(cls, pool: KVPool, batch: ForwardBatch) -> PagedAttention:
        """The KV store of one engine step: its metadata is built once here and shared by every layer."""
        return cls(pool, AttentionMetadata.build(batch))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this step's k, v [T, Hkv, D] in the pool, then attend q [T, Hq, D] with chapter 1's
        `attention`: the decode rows together as one padded batch, each prefill chunk over its own context.
        Returns [T, Hq * D] in the rows' order."""
        # BEGIN SOLUTION task2.paged_attention points=2
        md = self.md
        self.pool.store(layer, md.slot_mapping, k, v)
        parts = []
        if md.num_decodes:
            keys, values = self.pool.gather(layer, md.decode_slots)  # [B, max_context, Hkv, D]
            out = attention(q[: md.num_decodes].unsqueeze(1), keys, values, md.decode_mask)
            parts.append(out.squeeze(1))
        for span in md.prefills:
            keys, values = self.pool.gather(layer, span.slots)  # [context, Hkv, D]
            parts.append(attention(q[span.start: span.end], keys, values, span.mask))
        return parts[0] if len(parts) == 1 else torch.cat(parts)
        # END SOLUTION


if TYPE_CHECKING:  # the contract, checked by mypy (make test)
    _backend: AttentionBackend = PagedAttention
