"""The decode loop: prefill the prompt once, then one token per forward — with the cache or without.

Without the cache every step runs the whole sequence again; with it, each step runs one token and
reads the rest from `KVCache`. Same tokens either way (the tests check it), very different cost.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .kv_cache import KVCache
from .model import Transformer
from .request import SamplingParams, validate_prompt
from .sampling import sample_next

__all__ = ["SamplingParams", "generate", "sample_next", "validate_prompt"]


@torch.inference_mode()
def generate(model: Transformer, prompt_ids: Sequence[int] | torch.Tensor, params: SamplingParams = SamplingParams(),
             use_cache: bool = True,
             sampler: Callable[[torch.Tensor, SamplingParams, torch.Generator | None], int] = sample_next) -> list[int]:
    """New token ids for one prompt (stops at max_new_tokens or a stop token, which is included). `sampler` picks
    each token from the logits of the last position (`sample_next`: greedy, or temperature and top-p)."""
    ids = validate_prompt(model.config, prompt_ids, params.max_new_tokens)
    generator = params.make_generator(model.device)
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
        token = sampler(model.compute_logits(hidden[-1]), params, generator)
        out.append(token)
        if token in params.stop_token_ids:
            break
        step_ids = [token] if cache is not None else ids + out
    # END SOLUTION
    return out
