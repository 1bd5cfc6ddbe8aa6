"""Kernel 1 of 3: scatter this step's new K/V rows into the paged pool at their `slot_mapping`.

Chapter 2 does this with one indexed assignment per tensor (`KVPool.store`); vLLM calls the same operation
`reshape_and_cache`, SGLang `set_kv_buffer`. One Triton program copies one token: its K and V rows
(num_kv_heads * head_dim contiguous elements each) go to row `slot` of the layer's flat pool
[num_slots, num_kv_heads, head_dim]. A slot of -1 means "do not store" (padding rows of a CUDA-graph batch,
as in vLLM), so the program returns without writing.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kvcache_kernel(
    k_ptr, v_ptr,  # [T, H_kv, D] this step's keys and values (rows may be strided)
    k_cache_ptr, v_cache_ptr,  # [num_slots, H_kv, D] one layer of the pool, contiguous
    slot_mapping_ptr,  # [T] int64: destination slot of each token, -1 = skip
    stride_k_t, stride_v_t,  # elements between two tokens' rows in k / v
    ROW: tl.constexpr,  # H_kv * D: elements of one token's K (or V) row
    ROW_PAD: tl.constexpr,  # ROW rounded up to a power of two (Triton block shapes are powers of two)
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)  # int64: slot * ROW overflows int32 in big pools
    if slot < 0:
        return
    cols = tl.arange(0, ROW_PAD)
    inside = cols < ROW
    # BEGIN SOLUTION task6.store
    src = token.to(tl.int64)
    k = tl.load(k_ptr + src * stride_k_t + cols, mask=inside)
    v = tl.load(v_ptr + src * stride_v_t + cols, mask=inside)
    tl.store(k_cache_ptr + slot * ROW + cols, k, mask=inside)
    tl.store(v_cache_ptr + slot * ROW + cols, v, mask=inside)
    # END SOLUTION


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """k, v [T, H_kv, D]; k_cache, v_cache: one layer of the pool, [num_blocks, block_size, H_kv, D] (or any
    contiguous shape ending in H_kv, D); slot_mapping [T] int64, -1 to skip a row."""
    T, H, D = k.shape
    if v.shape != k.shape or k_cache.shape != v_cache.shape or k_cache.shape[-2:] != (H, D):
        raise ValueError(f"shape mismatch: k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
    if slot_mapping.shape != (T,):
        raise ValueError(f"slot_mapping must be [{T}], got {tuple(slot_mapping.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the pool must be contiguous")
    if k.stride(-1) != 1 or k.stride(-2) != D or v.stride(-1) != 1 or v.stride(-2) != D:
        raise ValueError("each token's K/V row must be contiguous ([T, H_kv, D] with unit inner strides)")
    if T == 0:
        return
    _store_kvcache_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
                                ROW=H * D, ROW_PAD=triton.next_power_of_2(H * D))
