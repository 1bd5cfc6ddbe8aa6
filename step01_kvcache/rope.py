"""Rotary position embeddings (RoPE): position enters attention by rotating q and k, not by adding to x.

Because the rotation of a key depends only on its own position, a key can be rotated once, cached, and
reused by every later query: that is what makes a KV cache correct for RoPE models.

Layout (Hugging Face's Llama, which the oracle holds us to): dimension `i < head_dim/2` of a head is
paired with dimension `i + head_dim/2`, and pair `i` turns at its own frequency `theta ** (-2i / head_dim)`:
at position `p` it is rotated by the angle `p * theta ** (-2i / head_dim)`.
"""
from __future__ import annotations

import torch
from torch import nn


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate every dimension pair of q [T, Hq, D] and k [T, Hkv, D] by its token's angle.

    cos, sin: [T, 1, D] from `RotaryEmbedding` (shared by the heads; both dimensions of a pair hold the
    same angle).
    """
    # BEGIN SOLUTION task1.rope points=2
    half = q.shape[-1] // 2
    q_turned = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    k_turned = torch.cat((-k[..., half:], k[..., :half]), dim=-1)
    return q * cos + q_turned * sin, k * cos + k_turned * sin
    # END SOLUTION


class RotaryEmbedding(nn.Module):
    """The rotation angles of absolute positions; evaluated once per forward, used by every layer."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim / 2]: pair i's frequency

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, head_dim] of the T tokens' angles (computed in fp32, returned in `dtype`)."""
        # BEGIN SOLUTION task1.rope points=2
        angles = torch.outer(positions.to(torch.float32), self.inv_freq)  # [T, head_dim / 2]
        emb = torch.cat((angles, angles), dim=-1)  # [T, head_dim]: a pair's two dimensions share the angle
        return emb.cos().unsqueeze(1).to(dtype), emb.sin().unsqueeze(1).to(dtype)
        # END SOLUTION
