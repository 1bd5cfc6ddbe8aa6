"""Rotary position embeddings (RoPE): position enters attention by rotating q and k, not by adding to x.

Because the rotation of a key depends only on its own position, a key can be rotated once, cached, and
reused by every later query: that is what makes a KV cache correct for RoPE models.
"""
from __future__ import annotations

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim (the Hugging Face / Llama layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by their tokens' angles; cos, sin: [T, 1, D] (shared by heads)."""
    # BEGIN SOLUTION task1.rope
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    # END SOLUTION


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables indexed by absolute position; looked up once per forward, used by every layer."""

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_positions, head_dim]
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, head_dim] for the T tokens' absolute positions."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)
