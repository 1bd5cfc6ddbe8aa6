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

**Split-KV for short chunks.** A chunk of a few dozen tokens after a long cached prefix (a warm request of the
write-up's `long` benchmark: 38 new tokens after 2,080) is one query block per head: 9 programs for SmolLM2 on a
GPU of 132 SMs, each walking the whole prefix alone. Decode met the same problem and split the keys (flash-decoding);
extend does the same: when the launch has fewer programs than the GPU holds (`FILL_PER_SM` per SM), each sequence's
cached prefix is cut into splits of whole tiles, no shorter than `MIN_SPLIT_LEN` tokens, every query block attends
each split in its own program (the last split also takes the new tokens, with the causal mask), and decode's merge
combines the partial results by their log-sum-exp. Long chunks fill the GPU with query blocks and are not split.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .decode_attention import (
    LOG2E,
    Partials,
    attend_tile,
    compute_q,
    merge_partials,
    store_partial,
    values,
)
from .launch import check_attention_inputs, sm_count
from .store_kvcache import kernel_scales

# (BLOCK_M, BLOCK_N, num_warps, num_stages), the best of `bench.py --part sweep` on an H200. 128-row tiles reuse
# each K/V tile for twice the rows, but a chunk's last tile is half empty on average: they pay for long chunks.
LONG_CHUNK_TILE = (128, 128, 8, 2)
SHORT_CHUNK_TILE = (64, 64, 4, 3)
LONG_CHUNK = 1024  # average new tokens per sequence from which LONG_CHUNK_TILE is used
FILL_PER_SM = 4  # a launch with fewer programs than this many per SM splits its prefixes
MIN_SPLIT_LEN = 256  # tokens of a prefix split: shorter ones cost more in partials and merging than they gain
MAX_SPLITS = 16


@triton.jit
def _extend_kernel(
    q_ptr,  # [T, H_q, D] the new tokens of every sequence, flat
    k_cache_ptr, v_cache_ptr,  # [num_slots, H_kv, D] one layer of the pool (new tokens already stored)
    k_scale_ptr, v_scale_ptr,  # an FP8 pool's scales (attend_tile, SCALE_SLOT / SCALE_HEAD); unused otherwise
    block_table_ptr,  # [B, max_blocks]
    query_start_loc_ptr,  # [B + 1] first flat row of each sequence
    seq_lens_ptr,  # [B] cached + new tokens
    o_ptr,  # [T, H_q, D]
    mid_o_ptr, mid_lse_ptr, num_splits_ptr,  # merge slots per flat row (decode_attention.Partials), with SPLITS > 1
    stride_q_t, stride_o_t, stride_bt_b, sm_scale_log2, min_split_len,
    H_Q: tl.constexpr, H_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, SPLITS: tl.constexpr,
    SCALE_SLOT: tl.constexpr, SCALE_HEAD: tl.constexpr,
):
    # the last query blocks see the most keys: start them first; the splits of one block are neighbours
    m_block = tl.num_programs(0) // SPLITS - 1 - tl.program_id(0) // SPLITS
    split = tl.program_id(0) % SPLITS
    head = tl.program_id(1)  # the query heads of one KV head are neighbours: their K/V tiles meet in L2
    b = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_start
    if m_block * BLOCK_M >= q_len:  # the grid is sized for the longest sequence
        return
    seq_len = tl.load(seq_lens_ptr + b)
    prefix_len = seq_len - q_len
    # this sequence's splits of its prefix: as many as the grid allows, none shorter than min_split_len, whole tiles
    num_splits = tl.maximum(tl.minimum(SPLITS, tl.cdiv(prefix_len, min_split_len)), 1)
    if split >= num_splits:
        return
    split_len = tl.cdiv(tl.cdiv(prefix_len, BLOCK_N), num_splits) * BLOCK_N
    kv_head = head // (H_Q // H_KV)

    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    q_pos = prefix_len + rows  # absolute position of each query row
    dims = tl.arange(0, HEAD_DIM)
    flat = (q_start + rows).to(tl.int64)
    q = tl.load(q_ptr + flat[:, None] * stride_q_t + head * HEAD_DIM + dims[None, :], mask=row_ok[:, None],
                other=0.0)
    q = compute_q(q, k_cache_ptr)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    base = prefix_len * 0  # where the keys of the causal part start: 0, or the new tokens when the prefix is split
    if num_splits > 1:  # this split's share of the prefix: every row sees it whole
        base = prefix_len
        lo = split * split_len
        hi = tl.minimum(lo + split_len, prefix_len)
        for tile in range(lo, hi, BLOCK_N):
            m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block_table_ptr, b, stride_bt_b,
                                         kv_head, tile, q_pos, hi, sm_scale_log2, True, False, H_KV, HEAD_DIM,
                                         BLOCK_SIZE, BLOCK_N, IEEE, k_scale_ptr, v_scale_ptr, SCALE_SLOT,
                                         SCALE_HEAD)
    if split == num_splits - 1:  # the last split (or the only one) takes the keys from `base` on, causally
        # Keys every row of this block sees (position <= the first row's): whole tiles, no mask.
        unmasked_end = base + (prefix_len - base + m_block * BLOCK_M + 1) // BLOCK_N * BLOCK_N
        for tile in range(base, unmasked_end, BLOCK_N):
            m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block_table_ptr, b, stride_bt_b,
                                         kv_head, tile, q_pos, seq_len, sm_scale_log2, False, False, H_KV, HEAD_DIM,
                                         BLOCK_SIZE, BLOCK_N, IEEE, k_scale_ptr, v_scale_ptr, SCALE_SLOT,
                                         SCALE_HEAD)
        # The diagonal tiles, up to the last row's position, with the causal mask.
        masked_end = tl.minimum(prefix_len + (m_block + 1) * BLOCK_M, seq_len)
        for tile in range(unmasked_end, masked_end, BLOCK_N):
            m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block_table_ptr, b, stride_bt_b,
                                         kv_head, tile, q_pos, seq_len, sm_scale_log2, True, True, H_KV, HEAD_DIM,
                                         BLOCK_SIZE, BLOCK_N, IEEE, k_scale_ptr, v_scale_ptr, SCALE_SLOT,
                                         SCALE_HEAD)

    acc = values(acc, k_cache_ptr)
    if num_splits == 1:
        out = acc / l_i[:, None]  # every real row sees at least key 0, so l_i > 0
        tl.store(o_ptr + flat[:, None] * stride_o_t + head * HEAD_DIM + dims[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:  # every split has keys for every row: its partial, for the merge
        store_partial(mid_o_ptr, mid_lse_ptr, flat * H_Q + head, split, SPLITS, m_i, l_i, acc, row_ok, HEAD_DIM)
    if (split == 0) & (head == 0):
        tl.store(num_splits_ptr + flat, num_splits, mask=row_ok)


def extend_splits(num_seqs: int, max_query_len: int, max_prefix_len: int, num_heads: int, block_m: int,
                  num_sms: int, min_split_len: int = MIN_SPLIT_LEN) -> int:
    """The grid's split axis (the rule of the docstring): 1 when the query blocks fill the GPU or no prefix is long
    enough to split, else enough splits to fill it, each no shorter than `min_split_len`. Host integers only (a
    CUDA graph passes the longest prefix it may replay; each sequence clamps by its own on the device)."""
    programs = triton.cdiv(max_query_len, block_m) * num_heads * num_seqs
    if programs >= FILL_PER_SM * num_sms or max_prefix_len < 2 * min_split_len:
        return 1
    return min(triton.cdiv(FILL_PER_SM * num_sms, programs), triton.cdiv(max_prefix_len, min_split_len), MAX_SPLITS)


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     query_start_loc: torch.Tensor, seq_lens: torch.Tensor, max_query_len: int,
                     out: torch.Tensor | None = None, block_m: int | None = None, block_n: int | None = None,
                     num_warps: int | None = None, num_stages: int | None = None, max_prefix_len: int | None = None,
                     splits: int | None = None, min_split_len: int = MIN_SPLIT_LEN,
                     kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q [T, H_q, D] flat new tokens; query_start_loc [B + 1]; seq_lens [B] (cached + new, new K/V already
    stored); max_query_len: the longest q_len (sizes the grid without reading the GPU). Returns [T, H_q, D].
    The tile defaults depend on the average chunk, T / B: shapes only, no GPU read. `max_prefix_len` (a host
    integer; by default the block table's width) sets the split rule (`extend_splits`), or `splits` the grid's
    split axis itself. A float8_e4m3fn pool takes its layer's `kv_scales` (store_kvcache.py's `scale_layout`)."""
    T, Hq, D = q.shape
    _, block_size, Hkv, _ = k_cache.shape
    B = seq_lens.shape[0]
    if query_start_loc.shape != (B + 1,):
        raise ValueError(f"query_start_loc {tuple(query_start_loc.shape)} does not match {B} sequences")
    out = check_attention_inputs(q, k_cache, v_cache, block_table, B, out)
    k_scale, v_scale, scale_slot, scale_head = kernel_scales(k_cache, kv_scales)
    if T == 0:
        return out
    tile = LONG_CHUNK_TILE if T >= LONG_CHUNK * B else SHORT_CHUNK_TILE
    block_m, block_n, num_warps, num_stages = (given or default for given, default in
                                               zip((block_m, block_n, num_warps, num_stages), tile))
    if splits is None:
        longest = block_table.shape[1] * block_size if max_prefix_len is None else max_prefix_len
        splits = extend_splits(B, max_query_len, longest, Hq, block_m, sm_count(q.device), min_split_len)
    if not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"splits must be in 1..{MAX_SPLITS}, got {splits}")
    partials = Partials.empty(T, Hq, D, splits, q.device) if splits > 1 else Partials.empty(0, Hq, D, 1, q.device)
    num_splits = partials.num_splits if splits > 1 else torch.empty(T, dtype=torch.int32, device=q.device)
    num_splits.zero_()  # rows no program owns (a CUDA graph's padding, before its first replay) merge nothing
    grid = (triton.cdiv(max_query_len, block_m) * splits, Hq, B)
    _extend_kernel[grid](q, k_cache, v_cache, k_scale, v_scale, block_table, query_start_loc, seq_lens, out,
                         partials.mid_o,
                         partials.mid_lse, num_splits, q.stride(0), out.stride(0), block_table.stride(0),
                         LOG2E / math.sqrt(D), min_split_len, H_Q=Hq, H_KV=Hkv, HEAD_DIM=D, BLOCK_SIZE=block_size,
                         BLOCK_M=block_m, BLOCK_N=block_n, IEEE=q.dtype == torch.float32, SPLITS=splits,
                         SCALE_SLOT=scale_slot, SCALE_HEAD=scale_head, num_warps=num_warps, num_stages=num_stages)
    if splits > 1:
        merge_partials(partials, out)
    return out
