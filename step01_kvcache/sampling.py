"""Choosing the next token from the logits of one position.

`sample` returns a tensor on the logits' device and never reads a value back to the host: an engine that
samples on a GPU can feed the token into its next step without waiting for it (chapter 6's overlap
scheduling). `sample_next` is the same choice as a Python int, for the simple decode loop of this chapter.
"""
from __future__ import annotations

import torch

from .request import SamplingParams


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """One token id (a 0-d long tensor on logits' device) from the logits of one position [vocab]."""
    # BEGIN SOLUTION task1.sample points=2
    if params.temperature == 0:
        return torch.argmax(logits)
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p  # mass before this token already >= p
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs.masked_fill(outside, 0.0))
    return torch.multinomial(probs, 1, generator=generator)[0]
    # END SOLUTION


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """`sample` as a Python int (reads the token back to the host)."""
    return int(sample(logits, params, generator))
