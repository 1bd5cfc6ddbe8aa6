"""What a request is before any model runs: its decoding settings and its prompt, checked once.

Every engine of the course takes requests through these two, so a bad request fails the same way everywhere,
before any work is done. The check is vectorised (one numpy conversion, then min/max), not a Python loop over
the tokens: a 2k-token prompt costs microseconds, not milliseconds.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .config import ModelConfig


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; otherwise temperature + nucleus (top-p) sampling with a seeded generator."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """The request's own random stream, on the device that samples (a CUDA generator on a GPU)."""
        return None if self.greedy else torch.Generator(device=device).manual_seed(self.seed or 0)


def validate_prompt(cfg: ModelConfig, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int) -> list[int]:
    """Turn a prompt into a list of ints or raise ValueError saying what to fix. Every engine calls this."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 1:
            raise ValueError(f"prompt_ids must be a 1-D tensor of token ids, got shape {tuple(prompt_ids.shape)}; "
                             "pass one sequence at a time (e.g. ids[0])")
        if prompt_ids.dtype.is_floating_point or prompt_ids.dtype.is_complex or prompt_ids.dtype == torch.bool:
            raise ValueError(f"prompt_ids must hold integer token ids, got dtype {prompt_ids.dtype}; "
                             "tokenize the text first (tokenizer.encode)")
        ids = prompt_ids.cpu().numpy()
    else:
        ids = list(prompt_ids)
        # numpy integers (np.int64 from a tokenizer's arrays) are ints; True/False, floats and text are not token
        # ids. One pass in C over the element types, not an isinstance call per token.
        kinds = set(map(type, ids))
        if not all(issubclass(t, (int, np.integer)) and not issubclass(t, (bool, np.bool_)) for t in kinds):
            raise ValueError("prompt_ids must be ints; tokenize the text first (tokenizer.encode)")
        try:
            ids = np.asarray(ids, dtype=np.int64)
        except OverflowError:
            raise ValueError("a token id is outside the vocabulary; was the prompt tokenized for a different model?") \
                from None
    if ids.size == 0:
        raise ValueError("empty prompt: give at least one token (a chat template always adds some)")
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError("prompt_ids must be ints; tokenize the text first (tokenizer.encode)")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= cfg.vocab_size:
        raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary 0..{cfg.vocab_size - 1}; "
                         "was the prompt tokenized for a different model?")
    if len(ids) + max_new_tokens > cfg.max_position_embeddings:
        raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                         f"max length {cfg.max_position_embeddings}; shorten the prompt or lower max_new_tokens")
    return ids.tolist()
