"""Kernel 3 of 3: prefill with a cached prefix ("extend") over a flat, ragged batch.

Sequence b contributes q_len_b new tokens, rows query_start_loc[b] .. query_start_loc[b+1]-1 of the flat
batch (vLLM's `query_start_loc`, FlashAttention's `cu_seqlens_q`). Its context holds seq_len_b tokens: the
first seq_len_b - q_len_b were cached (by an earlier chunk, or a prefix-cache hit) and the last q_len_b are
the new ones, whose K/V `store_kvcache` has already written. So new token i sits at position
seq_len_b - q_len_b + i and sees keys 0 .. that position: a causal mask aligned to the bottom-right corner.
Every key, cached or new, is read from the pool through the block table — one code path, as in vLLM's
Triton unified attention (SGLang's `extend_attention.py` reads the new part from a separate buffer instead).

Prefill is compute-bound (each K/V tile is reused by BLOCK_M query rows), so this is FlashAttention's
forward loop: a BLOCK_M x BLOCK_N score tile per iteration, online softmax, no [T, S] matrix in memory.
Tiles wholly below the diagonal skip the mask; only the last few tiles of each row block pay for it.
The grid runs the query blocks of one head back to back, last (longest) block first, so the blocks that read
the same K/V share it in L2 and the short blocks fill in at the end of the launch.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .decode_attention import LOG2E, attend_tile

# (BLOCK_M, BLOCK_N, num_warps, num_stages), the best of `bench.py --part sweep` on an H200. 128-row tiles reuse
# each K/V tile for twice the rows, but a chunk's last tile is half empty on average: they pay for long chunks.
LONG_CHUNK_TILE = (128, 128, 8, 2)
SHORT_CHUNK_TILE = (64, 64, 4, 3)
LONG_CHUNK = 1024  # average new tokens per sequence from which LONG_CHUNK_TILE is used


@triton.jit
def _extend_kernel(
    q_ptr,  # [T, H_q, D] the new tokens of every sequence, flat
    k_cache_ptr, v_cache_ptr,  # [num_slots, H_kv, D] one layer of the pool (new tokens already stored)
    block_table_ptr,  # [B, max_blocks]
    query_start_loc_ptr,  # [B + 1] first flat row of each sequence
    seq_lens_ptr,  # [B] cached + new tokens
    o_ptr,  # [T, H_q, D]
    stride_q_t, stride_o_t, stride_bt_b, sm_scale_log2,
    H_Q: tl.constexpr, H_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):
    m_block = tl.num_programs(0) - 1 - tl.program_id(0)  # the last query blocks see the most keys: start them first
    head = tl.program_id(1)  # the query heads of one KV head are neighbours: their K/V tiles meet in L2
    b = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_start
    if m_block * BLOCK_M >= q_len:  # the grid is sized for the longest sequence
        return
    seq_len = tl.load(seq_lens_ptr + b)
    prefix_len = seq_len - q_len
    kv_head = head // (H_Q // H_KV)

    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    q_pos = prefix_len + rows  # absolute position of each query row
    dims = tl.arange(0, HEAD_DIM)
    flat = (q_start + rows).to(tl.int64)
    q = tl.load(q_ptr + flat[:, None] * stride_q_t + head * HEAD_DIM + dims[None, :], mask=row_ok[:, None],
                other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Keys every row of this block sees (position <= the first row's): whole tiles, no mask.
    unmasked_end = (prefix_len + m_block * BLOCK_M + 1) // BLOCK_N * BLOCK_N
    for tile in range(0, unmasked_end, BLOCK_N):
        m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block_table_ptr, b, stride_bt_b,
                                     kv_head, tile, q_pos, seq_len, sm_scale_log2, False, False, H_KV, HEAD_DIM,
                                     BLOCK_SIZE, BLOCK_N, IEEE)
    # The diagonal tiles, up to the last row's position, with the causal mask.
    masked_end = tl.minimum(prefix_len + (m_block + 1) * BLOCK_M, seq_len)
    for tile in range(unmasked_end, masked_end, BLOCK_N):
        m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block_table_ptr, b, stride_bt_b,
                                     kv_head, tile, q_pos, seq_len, sm_scale_log2, True, True, H_KV, HEAD_DIM,
                                     BLOCK_SIZE, BLOCK_N, IEEE)

    out = acc / l_i[:, None]  # every real row sees at least key 0, so l_i > 0
    tl.store(o_ptr + flat[:, None] * stride_o_t + head * HEAD_DIM + dims[None, :], out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None])


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     query_start_loc: torch.Tensor, seq_lens: torch.Tensor, max_query_len: int,
                     out: torch.Tensor | None = None, block_m: int | None = None, block_n: int | None = None,
                     num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """q [T, H_q, D] flat new tokens; query_start_loc [B + 1]; seq_lens [B] (cached + new, new K/V already
    stored); max_query_len: the longest q_len (sizes the grid without reading the GPU). Returns [T, H_q, D].
    The tile defaults depend on the average chunk, T / B: shapes only, no GPU read."""
    T, Hq, D = q.shape
    _, block_size, Hkv, Dk = k_cache.shape
    B = seq_lens.shape[0]
    if Dk != D or v_cache.shape != k_cache.shape:
        raise ValueError(f"q head_dim {D} vs pool {tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    if Hq % Hkv:
        raise ValueError(f"{Hq} query heads cannot be grouped over {Hkv} KV heads")
    if D & (D - 1) or D < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {D}")
    if query_start_loc.shape != (B + 1,) or block_table.shape[0] != B:
        raise ValueError(f"query_start_loc {tuple(query_start_loc.shape)} / block_table "
                         f"{tuple(block_table.shape)} do not match {B} sequences")
    if q.stride(-1) != 1 or q.stride(-2) != D or block_table.stride(-1) != 1:
        raise ValueError("q must be [T, H_q, D] with contiguous heads; block_table rows contiguous")
    out = torch.empty_like(q) if out is None else out
    if T == 0:
        return out
    tile = LONG_CHUNK_TILE if T >= LONG_CHUNK * B else SHORT_CHUNK_TILE
    block_m, block_n, num_warps, num_stages = (given or default for given, default in
                                               zip((block_m, block_n, num_warps, num_stages), tile))
    grid = (triton.cdiv(max_query_len, block_m), Hq, B)
    _extend_kernel[grid](q, k_cache, v_cache, block_table, query_start_loc, seq_lens, out,
                         q.stride(0), out.stride(0), block_table.stride(0), LOG2E / math.sqrt(D),
                         H_Q=Hq, H_KV=Hkv, HEAD_DIM=D, BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=block_n,
                         IEEE=q.dtype == torch.float32, num_warps=num_warps, num_stages=num_stages)
    return out
