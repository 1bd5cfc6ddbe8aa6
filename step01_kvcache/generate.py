"""The decode loop: prefill the prompt once, then one token per forward — with the cache or without.

Without the cache every step runs the whole sequence again; with it, each step runs one token and
reads the rest from `KVCache`. Same tokens either way (the tests check it), very different cost.
"""
from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .config import ModelConfig
from .kv_cache import KVCache
from .model import Transformer


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

    def make_generator(self) -> torch.Generator | None:
        return None if self.temperature == 0 else torch.Generator().manual_seed(self.seed or 0)


def validate_prompt(cfg: ModelConfig, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int) -> list[int]:
    """Turn a prompt into a list of ints or raise ValueError saying what to fix. Every engine calls this."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 1:
            raise ValueError(f"prompt_ids must be a 1-D tensor of token ids, got shape {tuple(prompt_ids.shape)}; "
                             "pass one sequence at a time (e.g. ids[0])")
        if prompt_ids.dtype.is_floating_point or prompt_ids.dtype.is_complex or prompt_ids.dtype == torch.bool:
            raise ValueError(f"prompt_ids must hold integer token ids, got dtype {prompt_ids.dtype}; "
                             "tokenize the text first (tokenizer.encode)")
        prompt_ids = prompt_ids.tolist()
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("empty prompt: give at least one token (a chat template always adds some)")
    # numpy integers (np.int64 from a tokenizer's arrays) are ints; True/False are not token ids
    if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids):
        raise ValueError("prompt_ids must be ints; tokenize the text first (tokenizer.encode)")
    ids = [int(t) for t in ids]
    bad = [t for t in ids if not 0 <= t < cfg.vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary 0..{cfg.vocab_size - 1}; "
                         "was the prompt tokenized for a different model?")
    if len(ids) + max_new_tokens > cfg.max_position_embeddings:
        raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                         f"max length {cfg.max_position_embeddings}; shorten the prompt or lower max_new_tokens")
    return ids


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from the logits of one position [vocab]."""
    # BEGIN SOLUTION task1.sample points=2
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p  # mass before this token already >= p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))
    # END SOLUTION


@torch.inference_mode()
def generate(model: Transformer, prompt_ids: Sequence[int] | torch.Tensor, params: SamplingParams = SamplingParams(),
             use_cache: bool = True) -> list[int]:
    """New token ids for one prompt (stops at max_new_tokens or a stop token, which is included)."""
    ids = validate_prompt(model.config, prompt_ids, params.max_new_tokens)
    generator = params.make_generator()
    device = model.device
    cache = KVCache(model.config, len(ids) + params.max_new_tokens, model.dtype, device) if use_cache else None
    out: list[int] = []
    # BEGIN SOLUTION task1.decode_loop points=2
    step_ids = ids  # the tokens this forward must run
    while len(out) < params.max_new_tokens:
        start = cache.length if cache is not None else 0
        tokens = torch.tensor(step_ids, device=device)
        positions = torch.arange(start, start + len(step_ids), device=device)
        hidden = model(tokens, positions, cache)
        if cache is not None:
            cache.advance(len(step_ids))
        token = sample_next(model.compute_logits(hidden[-1]), params, generator)
        out.append(token)
        if token in params.stop_token_ids:
            break
        step_ids = [token] if cache is not None else ids + out
    # END SOLUTION
    return out
