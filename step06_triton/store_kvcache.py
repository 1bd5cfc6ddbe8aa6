"""Kernel 1 of 3: scatter this step's new K/V rows into the paged pool at their `slot_mapping`.

Chapter 2 does this with one indexed assignment per tensor (`KVPool.store`); vLLM calls the same operation
`reshape_and_cache`, SGLang `set_kv_buffer`. One Triton program copies one token: its K and V rows
(num_kv_heads * head_dim contiguous elements each) go to row `slot` of the layer's flat pool
[num_slots, num_kv_heads, head_dim]. A slot of -1 means "do not store" (padding rows of a CUDA-graph batch,
as in vLLM), so the program returns without writing.

An FP8 pool (fp8_pool.py's `FP8KVPool`) is written by a second kernel that quantizes on the way, as vLLM's
`reshape_and_cache_flash` does with `kv_cache_dtype="fp8"`: each head row of the token is divided by its scale,
saturated at +-448 and rounded to e4m3, and with dynamic scales the scale is the row's own amax / 448, stored
beside the row (one fp32 per head and token). The attention kernels multiply the scales back as they load.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import fp8_pool

FP8_MAX = tl.constexpr(fp8_pool.FP8_MAX)  # the largest float8_e4m3fn


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


@triton.jit
def quantize_fp8(x, scale, DYNAMIC: tl.constexpr):
    """Rows x [H, D] (fp32) to float8_e4m3 with one scale per row: `scale` [H] as given (static scales), or with
    DYNAMIC each row's amax / 448, so that its largest element becomes 448 (a row of zeros gets 1). Every value is
    divided in IEEE fp32 (`div_rn`, as PyTorch divides), saturated at +-448 and rounded to the nearest e4m3 (ties
    to even). Returns (the e4m3 rows [H, D], their scales [H])."""
    # BEGIN SOLUTION task6.quantize points=2
    if DYNAMIC:
        amax = tl.max(tl.abs(x), axis=1)
        scale = tl.where(amax > 0, tl.math.div_rn(amax, tl.full(amax.shape, FP8_MAX, tl.float32)), 1.0)
    scaled = tl.math.div_rn(x, tl.broadcast_to(scale[:, None], x.shape))
    stored = tl.minimum(tl.maximum(scaled, -FP8_MAX), FP8_MAX).to(tl.float8e4nv)
    # END SOLUTION
    return stored, scale


@triton.jit
def _store_fp8_rows(x_ptr, cache_ptr, scale_ptr, slot, H_KV: tl.constexpr, H_PAD: tl.constexpr,
                    HEAD_DIM: tl.constexpr, DYNAMIC: tl.constexpr, SCALE_HEAD: tl.constexpr):
    """One token's K (or V): its H_kv head rows quantized into row `slot` of the pool, and (DYNAMIC) their scales
    into entry `slot` of the layer's scales [num_slots, H_kv]. Static scales are read at `head * SCALE_HEAD`
    (SCALE_HEAD 0: one scale for the layer)."""
    heads = tl.arange(0, H_PAD)
    offs = heads[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    real = heads < H_KV
    x = tl.load(x_ptr + offs, mask=real[:, None], other=0.0).to(tl.float32)
    if DYNAMIC:
        scale = tl.full([H_PAD], 1.0, tl.float32)  # replaced by each row's own
    else:
        scale = tl.load(scale_ptr + heads * SCALE_HEAD, mask=real, other=1.0)
    stored, scale = quantize_fp8(x, scale, DYNAMIC)
    tl.store(cache_ptr + slot * (H_KV * HEAD_DIM) + offs, stored, mask=real[:, None])
    if DYNAMIC:
        tl.store(scale_ptr + slot * H_KV + heads, scale, mask=real)


@triton.jit
def _store_kvcache_fp8_kernel(
    k_ptr, v_ptr,  # [T, H_kv, D] this step's keys and values (rows may be strided)
    k_cache_ptr, v_cache_ptr,  # [num_slots, H_kv, D] float8_e4m3fn, one layer of the pool
    k_scale_ptr, v_scale_ptr,  # fp32: [num_slots, H_kv] (dynamic) or [H_kv or 1] (static) scales of the layer
    slot_mapping_ptr,  # [T] int64, -1 = skip
    stride_k_t, stride_v_t,
    H_KV: tl.constexpr, H_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DYNAMIC: tl.constexpr,
    SCALE_HEAD: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    src = token.to(tl.int64)
    _store_fp8_rows(k_ptr + src * stride_k_t, k_cache_ptr, k_scale_ptr, slot, H_KV, H_PAD, HEAD_DIM, DYNAMIC,
                    SCALE_HEAD)
    _store_fp8_rows(v_ptr + src * stride_v_t, v_cache_ptr, v_scale_ptr, slot, H_KV, H_PAD, HEAD_DIM, DYNAMIC,
                    SCALE_HEAD)


def scale_layout(cache: torch.Tensor, scale: torch.Tensor) -> tuple[int, int]:
    """Where the scale of (slot, head) is in one layer's scales of an FP8 pool: (elements between two slots'
    scales, between two heads'). Per token and head, [num_blocks, block_size, H_kv]: (H_kv, 1); static per head,
    [H_kv]: (0, 1); static per layer, [1]: (0, 0). A stride of 0 shares one scale along that axis."""
    heads = cache.shape[-2]
    if scale.dtype != torch.float32 or not scale.is_contiguous() or scale.device != cache.device:
        raise ValueError(f"an FP8 layer's scales must be a contiguous fp32 tensor on the pool's device, got "
                         f"{scale.dtype} {tuple(scale.shape)} on {scale.device}")
    if tuple(scale.shape) == (*cache.shape[:2], heads):
        return heads, 1
    if tuple(scale.shape) in ((heads,), (1,)):
        return 0, int(scale.shape[0] > 1)
    raise ValueError(f"scales {tuple(scale.shape)} fit neither the pool {tuple(cache.shape)} (per token and head: "
                     f"{(*cache.shape[:2], heads)}) nor static scales ({heads},) or (1,)")


def fp8_scales(cache: torch.Tensor, kv_scales: tuple[torch.Tensor, torch.Tensor] | None
               ) -> tuple[torch.Tensor, torch.Tensor, int, int] | None:
    """For the kernels: None for a pool in the model's dtype; for an FP8 pool its (k_scale, v_scale) of the layer
    and their `scale_layout`, checked."""
    if cache.dtype != torch.float8_e4m3fn:
        if kv_scales is not None:
            raise ValueError(f"kv_scales are for a float8_e4m3fn pool, this one is {cache.dtype}")
        return None
    if kv_scales is None:
        raise ValueError("a float8_e4m3fn pool needs its kv_scales (k_scale, v_scale of the layer)")
    k_scale, v_scale = kv_scales
    layout = scale_layout(cache, k_scale)
    if scale_layout(cache, v_scale) != layout:
        raise ValueError(f"k_scale {tuple(k_scale.shape)} and v_scale {tuple(v_scale.shape)} differ")
    return k_scale, v_scale, *layout


def kernel_scales(cache: torch.Tensor, kv_scales: tuple[torch.Tensor, torch.Tensor] | None
                  ) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The attention kernels' scale arguments: (k_scale, v_scale, SCALE_SLOT, SCALE_HEAD) of an FP8 layer, or for a
    pool in the model's dtype the cache itself twice (never read: `attend_tile` reads scales of FP8 pools only)."""
    fp8 = fp8_scales(cache, kv_scales)
    return (cache, cache, 0, 0) if fp8 is None else fp8


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """k, v [T, H_kv, D]; k_cache, v_cache: one layer of the pool, [num_blocks, block_size, H_kv, D] (or any
    contiguous shape ending in H_kv, D); slot_mapping [T] int64, -1 to skip a row. A float8_e4m3fn pool takes
    `kv_scales`, its layer's (k_scale, v_scale) (see `scale_layout`): the rows are quantized as they are stored and,
    with scales per token, their scales written."""
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
    fp8 = fp8_scales(k_cache, kv_scales)
    if T == 0:
        return
    if fp8 is None:
        _store_kvcache_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
                                    ROW=H * D, ROW_PAD=triton.next_power_of_2(H * D))
        return
    if D & (D - 1):
        raise ValueError(f"an FP8 pool needs a power-of-two head_dim, got {D}")
    k_scale, v_scale, scale_slot, scale_head = fp8
    _store_kvcache_fp8_kernel[(T,)](k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping, k.stride(0), v.stride(0),
                                    H_KV=H, H_PAD=triton.next_power_of_2(H), HEAD_DIM=D, DYNAMIC=scale_slot > 0,
                                    SCALE_HEAD=scale_head)
