"""The paged KV pool: K and V of every layer as [num_layers, num_blocks, block_size, num_kv_heads, head_dim].

The engine builds its pool through one seam, `Engine(..., pool=KVPool)`: any callable `(model config, geometry,
dtype, device) -> KVPool`. This pool keeps K/V in the model's dtype; chapter 6's FP8 pool keeps one byte per element.

Memory is organised by physical page, not by sequence: any sequence's token can live in any block, and
the block table says where. Storing and reading are each one indexed tensor operation on a flat view of
the pool ([num_blocks * block_size, heads, dim], one row per slot), never a Python loop over tokens.
"""
from __future__ import annotations

import torch

from step01_kvcache.config import ModelConfig

from .geometry import PoolGeometry


class KVPool:
    """Preallocated K/V storage shared by all sequences; a slot is `block * block_size + offset`."""

    def __init__(self, cfg: ModelConfig, geometry: PoolGeometry, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        shape = (cfg.num_layers, geometry.num_blocks, geometry.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.geometry = geometry

    @property
    def bytes_per_block(self) -> int:
        return 2 * self.k[:, 0].nbytes  # K and V, all layers

    def per_slot_tensors(self) -> tuple[torch.Tensor, ...]:
        """Tensors laid out [num_layers, num_blocks, block_size, ...] that a block's K/V need beside them (none here;
        an FP8 pool's per-token scales): whoever copies a block elsewhere copies these too."""
        return ()

    def layer_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The scales a quantized pool keeps beside `layer`'s K and V (k_scale, v_scale), for kernels that read the
        pool in place; None: K/V are stored in the model's dtype, as here."""
        return None

    def _flat(self, cache: torch.Tensor, layer: int) -> torch.Tensor:
        return cache[layer].view(-1, cache.shape[-2], cache.shape[-1])  # [num_slots, heads, dim]

    def store(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put the K/V rows of this step's tokens [T, heads, dim] into their slots [T] (one write per tensor)."""
        # BEGIN SOLUTION task2.paged_attention points=2
        self._flat(self.k, layer)[slot_mapping] = k
        self._flat(self.v, layer)[slot_mapping] = v
        # END SOLUTION

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at any tensor of slot indices (e.g. [batch, context]): one flat-index read each."""
        # BEGIN SOLUTION task2.paged_attention points=2
        return self._flat(self.k, layer)[slots], self._flat(self.v, layer)[slots]
        # END SOLUTION
