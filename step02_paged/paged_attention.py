"""Attention over the paged pool: the KV store that replaces chapter 1's contiguous cache.

Per engine step the tokens of all scheduled sequences form one flat batch [T]. `AttentionMetadata` is
built once per step (slot of every new token, context slots of every sequence, masks) and shared by all
layers. Sequences with a single new token are attended together as one padded batch — decodes, and
also a prefill chunk that happens to be one token long (vLLM splits by query length the same way);
each longer prefill chunk is attended on its own, with a causal mask offset by its cached context.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from step01_kvcache.attention import attention

from .kv_pool import KVPool
from .slot_mapping import block_table_tensor, context_slots, flat_batch, slot_mapping


def count_decodes(num_new: list[int]) -> int:
    """How many leading sequences of the step run a single token (attended as one batch). The engine puts
    them first; a single-token sequence after a longer one is a caller's error."""
    num_decodes = next((i for i, t in enumerate(num_new) if t != 1), len(num_new))
    if any(t == 1 for t in num_new[num_decodes:]):
        raise ValueError("single-token sequences must come first in the batch")
    return num_decodes


@dataclass(frozen=True)
class PrefillSpan:
    start: int  # rows start:end of the flat batch
    end: int
    slots: torch.Tensor  # [context_len] slots of positions 0..context_len-1
    mask: torch.Tensor | None  # [end - start, context_len], True = hidden


@dataclass(frozen=True)
class AttentionMetadata:
    positions: torch.Tensor  # [T] absolute position of each new token (for RoPE)
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is stored
    num_decodes: int  # the first num_decodes rows are single-token sequences
    decode_slots: torch.Tensor | None  # [num_decodes, max_context]
    decode_mask: torch.Tensor | None  # [num_decodes, 1, max_context], True = padding beyond a context
    prefills: tuple[PrefillSpan, ...]

    @classmethod
    def build(cls, block_tables: list[list[int]], num_computed: list[int], num_new: list[int],
              block_size: int, device: torch.device | str = "cpu") -> AttentionMetadata:
        """Sequence i contributes positions num_computed[i] .. num_computed[i] + num_new[i] - 1.
        Sequences with num_new == 1 must come first."""
        n, num_decodes = len(num_new), count_decodes(num_new)
        tables = block_table_tensor(block_tables, device)
        computed = torch.tensor(num_computed, dtype=torch.long, device=device)
        counts = torch.tensor(num_new, dtype=torch.long, device=device)
        seq_index, positions, starts = flat_batch(computed, counts)
        slots = slot_mapping(tables, seq_index, positions, block_size)

        decode_slots = decode_mask = None
        if num_decodes:
            ctx = computed[:num_decodes] + 1
            width = int(ctx.max())
            decode_slots = context_slots(tables[:num_decodes], width, block_size)
            decode_mask = (torch.arange(width, device=device)[None, :] >= ctx[:, None]).unsqueeze(1)
        prefills = []
        for i in range(num_decodes, n):
            start, ctx = int(starts[i]), num_computed[i] + num_new[i]
            q_pos = positions[start: start + num_new[i]]
            mask = torch.arange(ctx, device=device)[None, :] > q_pos[:, None]
            prefills.append(PrefillSpan(start, start + num_new[i], context_slots(tables[i: i + 1], ctx, block_size)[0],
                                        mask))
        return cls(positions, slots, num_decodes, decode_slots, decode_mask, tuple(prefills))


class PagedAttention:
    """A KVStore (see step01_kvcache.attention): store this step's K/V into the pool, attend from it."""

    def __init__(self, pool: KVPool, metadata: AttentionMetadata) -> None:
        self.pool, self.md = pool, metadata

    @classmethod
    def for_step(cls, pool: KVPool, block_tables: list[list[int]], num_computed: list[int],
                 num_new: list[int]) -> PagedAttention:
        """The KV store of one engine step: its metadata is built once here and shared by every layer."""
        return cls(pool, AttentionMetadata.build(block_tables, num_computed, num_new, pool.block_size,
                                                 pool.k.device))

    @property
    def positions(self) -> torch.Tensor:
        """Absolute position of every new token of the step (the model's RoPE input)."""
        return self.md.positions

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
