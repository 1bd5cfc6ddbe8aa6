"""The naive KV cache: one pre-allocated contiguous buffer per request, appended to at every step.

Without it every decode step recomputes K and V of the whole prefix (O(n) work per token, O(n^2) per
answer). With it a step computes K/V for the new token only. The price is memory reserved up front for
`max_len` tokens whether the request uses them or not — the waste that chapter 2's paging removes.
"""
from __future__ import annotations

import torch

from .attention import attention, causal_mask
from .config import ModelConfig


class KVCache:
    """K and V of one sequence: tensors [num_layers, max_len, num_kv_heads, head_dim], filled to `length`."""

    def __init__(self, cfg: ModelConfig, max_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        if not 0 < max_len <= cfg.max_position_embeddings:
            raise ValueError(f"max_len must be in 1..{cfg.max_position_embeddings}, got {max_len}")
        shape = (cfg.num_layers, max_len, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0  # tokens whose K/V are stored in every layer

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append this step's k, v after the cached ones, then attend over all of them."""
        # BEGIN SOLUTION task1.cache_attend points=2
        start, T = self.length, q.shape[0]
        end = start + T
        if end > self.max_len:
            raise ValueError(f"KV cache full: {start} cached + {T} new > max_len {self.max_len}")
        self.k[layer, start:end] = k
        self.v[layer, start:end] = v
        q_positions = torch.arange(start, end, device=q.device)
        return attention(q, self.k[layer, :end], self.v[layer, :end], causal_mask(q_positions, end))
        # END SOLUTION

    def advance(self, num_tokens: int) -> None:
        """Called once per forward, after all layers stored their K/V."""
        self.length += num_tokens

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
