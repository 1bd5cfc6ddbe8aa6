"""Grouped-query attention as plain tensor algebra, and the Attention module that calls it.

`attention()` is written once here and reused by every later chapter: chapter 2 gathers K/V out of a
paged pool and calls it with a padded batch; only where K/V live changes, never the math.
"""
from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import nn

from .rope import apply_rotary


def causal_mask(q_positions: torch.Tensor, kv_len: int) -> torch.Tensor | None:
    """Boolean mask [T, S], True where query i must not see key j (key position > query position).

    Built with one broadcast comparison (no Python loop over rows). A single query at the end of the
    sequence — every decode step — sees everything, so no mask at all.
    """
    if q_positions.numel() == 1 and int(q_positions[-1]) == kv_len - 1:
        return None
    key_positions = torch.arange(kv_len, device=q_positions.device)
    return key_positions[None, :] > q_positions[:, None]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v with GQA, batched over heads (and over sequences, if any).

    q: [..., T, Hq, D]; k, v: [..., S, Hkv, D]; mask: bool broadcastable to [..., T, S], True = hidden.
    Each KV head serves g = Hq/Hkv query heads. Instead of copying K/V g times, the g query heads of a group
    are stacked as extra query rows: one [g·T, D] x [D, S] product per KV head reads K once (for a 35-token
    chunk over 2k cached tokens this halves the attention time against broadcasting K over g).
    Returns [..., T, Hq * D].
    """
    *batch, T, Hq, D = q.shape
    S, Hkv = k.shape[-3], k.shape[-2]
    g = Hq // Hkv
    qg = q.reshape(*batch, T, Hkv, g, D).movedim(-4, -2).reshape(*batch, Hkv, g * T, D)  # rows: (head, token)
    scores = qg @ k.movedim(-3, -1)  # [..., Hkv, g*T, S]; K read in place as [Hkv, D, S]
    scores.mul_(1.0 / math.sqrt(D))
    if mask is not None:
        scores.view(*batch, Hkv, g, T, S).masked_fill_(mask.unsqueeze(-3).unsqueeze(-3), float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    out = probs @ v.movedim(-3, -2)  # [..., Hkv, g*T, D]
    return out.view(*batch, Hkv, g, T, D).movedim(-2, -4).reshape(*batch, T, Hq * D)


class KVStore(Protocol):
    """Where a layer's keys and values live. Step 1: one contiguous buffer; step 2: a paged pool."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this step's k, v for `layer`, then attend q over everything stored so far."""
        ...


class Attention(nn.Module):
    """Project to q, k, v; rotate q and k; attend through the KV store (or over just these tokens)."""

    def __init__(self, layer: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.layer, self.num_heads, self.num_kv_heads, self.head_dim = layer, num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv: KVStore | None) -> torch.Tensor:
        """x [T, hidden]; rope = (cos, sin) of the T tokens' positions, computed once per forward."""
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)
        q, k = apply_rotary(q, k, *rope)
        if kv is None:  # no cache: these T tokens are the whole sequence
            out = attention(q, k, v, causal_mask(positions, T))
        else:
            out = kv.attend(self.layer, q, k, v)
        return self.o_proj(out)
