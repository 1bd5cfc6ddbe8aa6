"""What every attention launch of the chapter reads before it starts: the GPU's size and the inputs' shapes.

The launch rules (decode's split plan, extend's prefix splits, cascade's prefix pass) size their grids to the GPU's
streaming multiprocessors: `sm_count` reads that number once per device, here and nowhere else. And the three
kernels read a query tensor, one layer of the pool and a block table the same way: `check_attention_inputs` says,
with a ValueError naming the culprit, which of them a kernel could not read (the kernels themselves check nothing).
"""
from __future__ import annotations

import functools

import torch

H200_SMS = 132  # the GPU the course measures: under the interpreter the rules split as they would there


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (a CPU, under the interpreter: an H200's)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return H200_SMS


def check_attention_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                           rows: int, out: torch.Tensor | None) -> torch.Tensor:
    """q [rows or tokens, H_q, D] with contiguous heads over one layer of the pool [num_slots or blocks, ..., H_kv,
    D], H_q a multiple of H_kv, D a power of two >= 16, one contiguous block-table row per sequence (`rows` of
    them); returns `out`, made like q when not given, after checking it is."""
    Hq, D = q.shape[-2:]
    Hkv, Dk = k_cache.shape[-2:]
    if Dk != D or v_cache.shape != k_cache.shape:
        raise ValueError(f"q head_dim {D} vs pool {tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    if Hq % Hkv:
        raise ValueError(f"{Hq} query heads cannot be grouped over {Hkv} KV heads")
    if D & (D - 1) or D < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {D}")
    if block_table.shape[0] != rows:
        raise ValueError(f"block_table {tuple(block_table.shape)} vs {rows} sequences")
    if q.stride(-1) != 1 or q.stride(-2) != D or block_table.stride(-1) != 1:
        raise ValueError(f"q must be {list(q.shape[:-2]) + ['H_q', 'D']} with contiguous heads; block_table rows "
                         "contiguous")
    out = torch.empty_like(q) if out is None else out
    if out.shape != q.shape or out.stride(-1) != 1 or out.stride(-2) != D:
        raise ValueError(f"out must be shaped like q {tuple(q.shape)} with contiguous heads, got {tuple(out.shape)}")
    return out
