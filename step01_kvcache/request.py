"""What a request is before any model runs: its decoding settings and its prompt, checked once.

Every engine of the course takes requests through these two, so a bad request fails the same way everywhere,
before any work is done. The check is vectorised (one numpy conversion, then min/max), not a Python loop over
the tokens: a 2k-token prompt costs microseconds, not milliseconds.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .config import ModelConfig

MIN_TEMPERATURE = 1e-5  # below it logits / temperature overflows; vLLM treats such values as greedy, we refuse them


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; otherwise temperature + nucleus (top-p) sampling with a seeded generator. Every
    field is checked here, type and range, so that a bad value fails when the request is made, never inside a
    step that other requests share."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        t = self.temperature
        if not _is_real(t) or not math.isfinite(t) or t < 0 or 0 < t < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, got {t!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be None or an int in [0, 2**63), got {self.seed!r}")
        stops = self.stop_token_ids
        if isinstance(stops, (str, bytes, dict)) or not isinstance(stops, (tuple, list, set, frozenset)) \
                or not all(_is_int(t) and t >= 0 for t in stops):
            raise ValueError(f"stop_token_ids must be a collection of token ids (ints >= 0), e.g. (2,); "
                             f"got {stops!r}")
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "stop_token_ids", tuple(sorted(int(t) for t in set(stops))))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """The request's own random stream, on the device that samples (a CUDA generator on a GPU)."""
        return None if self.greedy else torch.Generator(device=device).manual_seed(self.seed or 0)


def validate_prompt(cfg: ModelConfig, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int) -> list[int]:
    """Turn a prompt into a list of ints or raise ValueError saying what to fix. Every engine calls this."""
    if isinstance(prompt_ids, (str, bytes, bytearray)) or \
            not isinstance(prompt_ids, (list, tuple, range, np.ndarray, torch.Tensor)):
        raise ValueError(f"prompt_ids must be a list, tuple or 1-D tensor of token ids, got "
                         f"{type(prompt_ids).__name__}; tokenize the text first (tokenizer.encode)")
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
