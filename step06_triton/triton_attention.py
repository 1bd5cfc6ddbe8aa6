"""The KVStore of chapter 1, on chapter 2's pool, with the three kernels: a drop-in for `PagedAttention`.

Per engine step the flat batch is [decodes | prefill chunks] (the engine puts single-token sequences
first). `TritonMetadata` is built once per step on the CPU and copied to the device in one go; every layer
then runs three launches: `store_kvcache` for all rows, `paged_decode_attention` for the decode rows,
`extend_attention` for the chunk rows. Chapter 2 gathered every context into a padded [B, max_context]
tensor first; here no K/V byte is copied — the kernels read the pool through the block table.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from step02_paged.kv_pool import KVPool
from step02_paged.paged_attention import count_decodes
from step02_paged.slot_mapping import block_table_tensor, flat_batch, slot_mapping

from .decode_attention import default_num_splits, paged_decode_attention
from .extend_attention import extend_attention
from .store_kvcache import store_kvcache


@dataclass(frozen=True)
class TritonMetadata:
    positions: torch.Tensor  # [T] absolute position of each new token (RoPE)
    slot_mapping: torch.Tensor  # [T] where each new token's K/V goes; -1 = nowhere (graph padding)
    block_table: torch.Tensor  # [B, max_blocks] int64
    seq_lens: torch.Tensor  # [B] tokens in the context after this step
    query_start_loc: torch.Tensor  # [B - num_decodes + 1] chunk rows, relative to the first chunk row
    num_decodes: int  # rows 0 .. num_decodes - 1 are single-token sequences
    max_query_len: int  # longest chunk (sizes the extend grid)
    num_splits: int  # split-KV pieces per decode

    @classmethod
    def build(cls, block_tables: list[list[int]], num_computed: list[int], num_new: list[int], block_size: int,
              num_kv_heads: int, device: torch.device | str) -> TritonMetadata:
        """Sequence i runs positions num_computed[i] .. num_computed[i] + num_new[i] - 1; single-token
        sequences first."""
        num_decodes = count_decodes(num_new)
        tables = block_table_tensor(block_tables)  # everything is built on the CPU, then copied in one transfer
        counts = torch.tensor(num_new)
        seq_lens = torch.tensor(num_computed) + counts
        seq_index, positions, _ = flat_batch(torch.tensor(num_computed), counts)
        chunk_counts = counts[num_decodes:]
        query_start_loc = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(chunk_counts, 0)])
        num_splits = default_num_splits(num_decodes, num_kv_heads, int(seq_lens[:num_decodes].max())) \
            if num_decodes else 1
        parts = (positions, slot_mapping(tables, seq_index, positions, block_size), seq_lens, query_start_loc, tables)
        flat = torch.cat([t.flatten() for t in parts]).to(device, non_blocking=True).split([t.numel() for t in parts])
        positions, slots, seq_lens, query_start_loc, tables = (f.view(t.shape) for f, t in zip(flat, parts))
        return cls(positions, slots, tables, seq_lens, query_start_loc, num_decodes,
                   int(chunk_counts.max()) if len(chunk_counts) else 0, num_splits)


class TritonPagedAttention:
    """A KVStore (see step01_kvcache.attention) over a KVPool, computed by the Triton kernels."""

    def __init__(self, pool: KVPool, metadata: TritonMetadata) -> None:
        self.pool, self.md = pool, metadata

    @classmethod
    def for_step(cls, pool: KVPool, block_tables: list[list[int]], num_computed: list[int],
                 num_new: list[int]) -> TritonPagedAttention:
        return cls(pool, TritonMetadata.build(block_tables, num_computed, num_new, pool.block_size,
                                              pool.k.shape[-2], pool.k.device))

    @property
    def positions(self) -> torch.Tensor:
        return self.md.positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        md, k_cache, v_cache = self.md, self.pool.k[layer], self.pool.v[layer]
        store_kvcache(k, v, k_cache, v_cache, md.slot_mapping)
        out = torch.empty_like(q)
        d = md.num_decodes
        if d:
            paged_decode_attention(q[:d], k_cache, v_cache, md.block_table[:d], md.seq_lens[:d], md.num_splits,
                                   out=out[:d])
        if d < q.shape[0]:
            extend_attention(q[d:], k_cache, v_cache, md.block_table[d:], md.query_start_loc, md.seq_lens[d:],
                             md.max_query_len, out=out[d:])
        return out.view(q.shape[0], -1)
