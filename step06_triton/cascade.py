"""Cascade attention: a decode step that reads a shared prefix once for all the sequences that share it.

Decode is bound by the bytes it reads, and plain paged decode reads every sequence's whole context: 64 requests
behind one 1,536-token system prompt read that prompt's K/V 64 times per layer and step, though the prefix cache
made it the very same blocks in every block table (chapters 3-5). Cascade attention (Hydragen, arXiv 2402.05099;
FlashInfer's `MultiLevelCascadeAttentionWrapper`; vLLM's cascade attention) cuts each sequence's softmax in two
and reads the shared part once:

1. **prefix pass** (`_cascade_prefix_kernel`): for a *group* of sequences that share a prefix, every query of the
   group (each sequence's new token, for each query head of one KV head) against the prefix's keys — a tile of
   BLOCK_M queries times a tile of keys is one matrix product, so the prefix is read once per tile of queries
   instead of once per sequence; its keys are cut into splits so that enough programs fill the GPU;
2. **suffix pass**: each sequence's own keys after its prefix, by chapter 6's split-KV decode kernel (the same
   kernel, told where to start: `decode_splits(..., kv_start, slot_base)`); a sequence in no group reads all of
   its keys, as in plain decode;
3. **merge**: softmax over all the keys from the parts' log-sum-exps, `o = Σ_i o_i · 2^(lse_i − lse)`: the merge of
   split-KV, unchanged (`merge_partials`). The prefix's splits fill a sequence's first merge slots, its suffix's
   splits the next ones.

Which sequences share what comes from the cache (`CacheManager.shared_prefixes`: block reference counts in chapter
3, tree nodes in chapters 4 and 5), never from new bookkeeping; `CascadeMetadata.build` turns the groups into the
kernels' work lists, on the host, in O(sequences + tiles).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from step02_paged.forward_batch import CascadeGroup
from step02_paged.geometry import cdiv

from .decode_attention import (
    LOG2E,
    Partials,
    attend_tile,
    check_decode_inputs,
    compute_q,
    decode_splits,
    merge_partials,
    num_kv_splits,
    store_partial,
    values,
)
from .launch import sm_count
from .store_kvcache import kernel_scales

PREFIX_TILE = {64: (64, 64, 4), 128: (64, 64, 4)}  # head_dim -> (BLOCK_M, BLOCK_N, num_warps) of the prefix pass
PREFIX_PROGRAMS_PER_SM = 4  # the prefix's keys are split until the pass has about this many programs per SM
MIN_PREFIX_SPLIT = 256  # tokens: a shorter split costs more in partial outputs than it gains in parallelism
MAX_PREFIX_SPLITS = 16


@triton.jit
def _cascade_prefix_kernel(
    q_ptr,  # [B, H_q, D] the decode rows' queries
    k_cache_ptr, v_cache_ptr,  # [num_slots, H_kv, D] one layer of the pool
    k_scale_ptr, v_scale_ptr,  # an FP8 pool's scales (attend_tile, SCALE_SLOT / SCALE_HEAD); unused otherwise
    block_table_ptr,  # [B, max_blocks] the decode rows' block tables (a group's prefix: its leader's row)
    tile_group_ptr, tile_row_ptr,  # [T] each tile's group, and its first query row within the group
    group_leader_ptr, group_len_ptr, group_splits_ptr, group_split_len_ptr,  # [G] per group
    group_start_ptr, group_size_ptr, members_ptr,  # [G], [G], [R]: the group's members, as batch rows
    num_tiles_ptr,  # [1] tiles in use (a CUDA graph's grid is sized for the most it may need)
    mid_o_ptr, mid_lse_ptr,  # the merge slots (decode_attention.Partials); a group's splits fill slots 0..
    stride_q_b, stride_bt_b, num_slots, sm_scale_log2,
    H_KV: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, SCALE_SLOT: tl.constexpr,
    SCALE_HEAD: tl.constexpr,
):
    kv_head = tl.program_id(0)
    tile_id = tl.program_id(1)
    split = tl.program_id(2)
    if tile_id >= tl.load(num_tiles_ptr):
        return
    g = tl.load(tile_group_ptr + tile_id)
    if split >= tl.load(group_splits_ptr + g):
        return
    prefix_len = tl.load(group_len_ptr + g)
    split_len = tl.load(group_split_len_ptr + g)
    start = split * split_len
    end = tl.minimum(start + split_len, prefix_len)

    # The tile's query rows: (member, query head of this KV head) pairs, GROUP rows per member.
    r = tl.load(tile_row_ptr + tile_id) + tl.arange(0, BLOCK_M)
    valid = r < tl.load(group_size_ptr + g) * GROUP
    member = tl.load(members_ptr + tl.load(group_start_ptr + g) + r // GROUP, mask=valid, other=0)
    head = kv_head * GROUP + r % GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + member[:, None].to(tl.int64) * stride_q_b + head[:, None] * HEAD_DIM + dims[None, :],
                mask=valid[:, None], other=0.0)
    q = compute_q(q, k_cache_ptr)
    leader = tl.load(group_leader_ptr + g)  # every member's table starts with the prefix: read one of them

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    full_end = start + (end - start) // BLOCK_N * BLOCK_N
    for tile in range(start, full_end, BLOCK_N):  # every query sees every prefix key: no mask
        m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block_table_ptr, leader,
                                    stride_bt_b, kv_head, tile, end, end, sm_scale_log2, False, False, H_KV,
                                    HEAD_DIM, BLOCK_SIZE, BLOCK_N, IEEE, k_scale_ptr, v_scale_ptr, SCALE_SLOT,
                                    SCALE_HEAD)
    for tile in range(full_end, end, BLOCK_N):  # the split's last, partial tile
        m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block_table_ptr, leader,
                                    stride_bt_b, kv_head, tile, end, end, sm_scale_log2, True, False, H_KV,
                                    HEAD_DIM, BLOCK_SIZE, BLOCK_N, IEEE, k_scale_ptr, v_scale_ptr, SCALE_SLOT,
                                    SCALE_HEAD)
    store_partial(mid_o_ptr, mid_lse_ptr, member * (H_KV * GROUP) + head, split, num_slots, m_i, l_i,
                  values(acc, k_cache_ptr), valid, HEAD_DIM)


@dataclass(frozen=True)
class CascadeGrid:
    """Fixed sizes for a cascade captured in a CUDA graph: every work list padded to these, every grid this big
    (programs past the work return at once), so that one graph replays any cascade that fits."""

    rows: int  # decode rows (the graph's batch)
    groups: int
    tiles: int
    prefix_splits: int
    splits: int  # the suffix pass's split axis

    @classmethod
    def for_batch(cls, rows: int, group_heads: int, min_group: int, head_dim: int, *, splits: int) -> CascadeGrid:
        """Room for any groups of `min_group` rows or more among `rows` decode rows whose suffixes (the keys after
        each row's group prefix, or its whole context) fit `splits` splits (`num_kv_splits`)."""
        groups = max(1, rows // min_group)
        block_m = PREFIX_TILE.get(head_dim, (64, 64, 4))[0]
        return cls(rows, groups, cdiv(rows * group_heads, block_m) + groups, MAX_PREFIX_SPLITS, splits)


def cascade_suffix_lens(groups: Sequence[CascadeGroup], seq_lens: Sequence[int]) -> np.ndarray:
    """The keys each decode row reads in the suffix pass: its context after its group's prefix, or all of it."""
    suffix = np.asarray(seq_lens, np.int64).copy()
    for grp in groups:
        suffix[list(grp.rows)] -= grp.prefix_len
    return suffix


@dataclass(frozen=True)
class CascadeMetadata:
    """The step's cascade, as the kernels read it (device int32 views of one tensor, made on the host and copied
    once), and the grid bounds as host integers."""

    kv_start: torch.Tensor  # [B] where each decode row's own keys start (its group's prefix length, else 0)
    slot_base: torch.Tensor  # [B] its first merge slot after the prefix's (its group's prefix splits, else 0)
    suffix_lens: torch.Tensor  # [B] keys of the suffix pass
    tile_group: torch.Tensor  # [T]
    tile_row: torch.Tensor  # [T]
    group_leader: torch.Tensor  # [G]
    group_len: torch.Tensor  # [G]
    group_splits: torch.Tensor  # [G]
    group_split_len: torch.Tensor  # [G]
    group_start: torch.Tensor  # [G]
    group_size: torch.Tensor  # [G]
    members: torch.Tensor  # [R]
    num_tiles: torch.Tensor  # [1]
    flat: torch.Tensor  # all of the above, one after the other (a graph's static copy is refreshed from it)
    grid: CascadeGrid  # the sizes of the lists and the grids
    block_m: int
    block_n: int

    @property
    def num_slots(self) -> int:
        """Merge slots per (row, head): the prefix's splits, then the suffix's."""
        return self.grid.prefix_splits + self.grid.splits

    @classmethod
    def build(cls, groups: Sequence[CascadeGroup], seq_lens: Sequence[int], num_heads: int, num_kv_heads: int,
              head_dim: int, device: torch.device | str, *, num_sms: int | None = None,
              grid: CascadeGrid | None = None) -> CascadeMetadata:
        """Work lists for decode rows with contexts `seq_lens` (host ints, the new token included) and `groups`.
        A group's queries are cut into tiles of BLOCK_M rows; its prefix's keys into splits of whole key tiles,
        enough of them that the prefix pass has about PREFIX_PROGRAMS_PER_SM programs per SM, no shorter than
        MIN_PREFIX_SPLIT tokens. With `grid` (a CUDA graph's), every list is padded to its fixed size; by default
        the lists and grids are this step's."""
        block_m, block_n, _ = PREFIX_TILE.get(head_dim, (64, 64, 4))
        group_heads = num_heads // num_kv_heads
        B, G = len(seq_lens), len(groups)
        rows_seen = [r for grp in groups for r in grp.rows]
        if len(set(rows_seen)) != len(rows_seen) or any(not 0 <= r < B for r in rows_seen):
            raise ValueError(f"every decode row (0..{B - 1}) belongs to at most one cascade group, got {groups}")
        kv_start, slot_base = np.zeros(B, np.int64), np.zeros(B, np.int64)
        tiles_per_group = [cdiv(len(grp.rows) * group_heads, block_m) for grp in groups]
        total_tiles = sum(tiles_per_group)
        target = PREFIX_PROGRAMS_PER_SM * (num_sms or sm_count(torch.device(device)))
        max_prefix_splits = grid.prefix_splits if grid else MAX_PREFIX_SPLITS
        splits, split_len = [], []
        for grp in groups:
            if not grp.rows or not 0 < grp.prefix_len < min(seq_lens[r] for r in grp.rows):
                raise ValueError(f"a cascade group needs rows and a prefix shorter than each row's context, got rows "
                                 f"{grp.rows} with a {grp.prefix_len}-token prefix")
            wanted = max(1, min(max_prefix_splits, cdiv(grp.prefix_len, MIN_PREFIX_SPLIT),
                                cdiv(target, num_kv_heads * total_tiles)))
            length = cdiv(cdiv(grp.prefix_len, block_n), wanted) * block_n
            splits.append(cdiv(grp.prefix_len, length))  # recounted: no empty split
            split_len.append(length)
            kv_start[list(grp.rows)] = grp.prefix_len
            slot_base[list(grp.rows)] = splits[-1]
        suffix = cascade_suffix_lens(groups, seq_lens)
        suffix_splits = num_kv_splits(int(suffix.max()) if B else 1)
        if grid is None:
            grid = CascadeGrid(B, G, max(total_tiles, 1), max(splits, default=1), suffix_splits)
        elif B > grid.rows or G > grid.groups or total_tiles > grid.tiles or suffix_splits > grid.splits:
            raise ValueError(f"{B} rows, {G} groups, {total_tiles} tiles, {suffix_splits} suffix splits do not fit the "
                             f"captured {grid}")
        tile_row = np.concatenate([np.arange(n) * block_m for n in tiles_per_group]) if G else []
        sizes = [len(grp.rows) for grp in groups]
        parts = [(kv_start, grid.rows), (slot_base, grid.rows), (suffix, grid.rows),
                 (np.repeat(np.arange(G), tiles_per_group), grid.tiles), (tile_row, grid.tiles),
                 ([grp.rows[0] for grp in groups], grid.groups), ([grp.prefix_len for grp in groups], grid.groups),
                 (splits, grid.groups), (split_len, grid.groups), (np.cumsum([0] + sizes)[:G], grid.groups),
                 (sizes, grid.groups), (rows_seen, grid.rows), ([total_tiles], 1)]
        padded = [np.pad(np.asarray(p, np.int64), (0, size - len(p))) for p, size in parts]
        padded[2][B:] = 1  # padding rows of a graph read one key, as in plain decode
        flat = torch.from_numpy(np.concatenate(padded).astype(np.int32))
        if torch.device(device).type == "cuda":
            flat = flat.pin_memory().to(device, non_blocking=True)
        return cls(*flat.split([size for _, size in parts]), flat=flat, grid=grid, block_m=block_m, block_n=block_n)


def cascade_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                             md: CascadeMetadata, out: torch.Tensor | None = None, *, num_warps: int | None = None,
                             kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None, **tuning) -> torch.Tensor:
    """Decode attention of rows q [B, H_q, D] over the pool, reading each group's shared prefix once: the prefix
    pass, the suffix pass (split-KV decode from each row's `kv_start`) and one merge. `md` from
    `CascadeMetadata.build`; `tuning` goes to the suffix pass (`decode_splits`); `kv_scales`, a float8_e4m3fn
    pool's scales of the layer. Returns [B, H_q, D]."""
    out = check_decode_inputs(q, k_cache, v_cache, block_table, md.suffix_lens, out)
    k_scale, v_scale, scale_slot, scale_head = kernel_scales(k_cache, kv_scales)
    B, Hq, D = q.shape
    if B == 0:
        return out
    _, block_size, Hkv, _ = k_cache.shape
    partials = Partials.empty(B, Hq, D, md.num_slots, q.device)
    if md.grid.groups:
        _cascade_prefix_kernel[(Hkv, md.grid.tiles, md.grid.prefix_splits)](
            q, k_cache, v_cache, k_scale, v_scale, block_table, md.tile_group, md.tile_row, md.group_leader,
            md.group_len, md.group_splits, md.group_split_len, md.group_start, md.group_size, md.members, md.num_tiles,
            partials.mid_o, partials.mid_lse, q.stride(0), block_table.stride(0), partials.num_slots,
            LOG2E / math.sqrt(D), H_KV=Hkv, GROUP=Hq // Hkv, HEAD_DIM=D, BLOCK_SIZE=block_size, BLOCK_M=md.block_m,
            BLOCK_N=md.block_n, IEEE=q.dtype == torch.float32, SCALE_SLOT=scale_slot, SCALE_HEAD=scale_head,
            num_warps=num_warps or PREFIX_TILE.get(D, (64, 64, 4))[2])
    decode_splits(q, k_cache, v_cache, block_table, md.suffix_lens, md.grid.splits, out, partials, md.kv_start,
                  md.slot_base, kv_scales=kv_scales, **tuning)
    merge_partials(partials, out)
    return out


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: q [M, H_q, D] against k, v [S, H_kv, D] (GQA, no mask) -> (out [M, H_q, D], natural-log
    log-sum-exp [M, H_q]), in fp32."""
    g = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(g, dim=1) for t in (k, v))
    scores = torch.einsum("mhd,shd->mhs", q.float(), k) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(scores, dim=-1)
    return torch.einsum("mhs,shd->mhd", torch.softmax(scores, dim=-1), v), lse


def merge_attention(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Reference merge: outputs over disjoint sets of keys, each with its log-sum-exp, into the output over all."""
    lse = torch.logsumexp(torch.stack([p[1] for p in parts]), dim=0)
    return sum(o * torch.exp(part_lse - lse)[..., None] for o, part_lse in parts)


def cascade_reference(q: torch.Tensor, keys: list[tuple[torch.Tensor, torch.Tensor]],
                      groups: Sequence[CascadeGroup]) -> torch.Tensor:
    """The cascade in plain torch (fp32): `keys[b]` is row b's whole context (k, v) [len, H_kv, D]; each group's
    queries attend to their leader's first `prefix_len` keys at once, each row to the rest of its own, and the
    parts merge by log-sum-exp. Equal to plain attention over each row's whole context (the tests hold both)."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    start = [0] * q.shape[0]
    prefix: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for grp in groups:
        k, v = keys[grp.rows[0]]
        o, lse = attention_with_lse(q[list(grp.rows)], k[: grp.prefix_len], v[: grp.prefix_len])
        for i, r in enumerate(grp.rows):
            prefix[r], start[r] = (o[i], lse[i]), grp.prefix_len
    for r, (k, v) in enumerate(keys):
        o, lse = attention_with_lse(q[r: r + 1], k[start[r]:], v[start[r]:])
        out[r] = merge_attention([(o[0], lse[0])] + ([prefix[r]] if r in prefix else []))
    return out
