"""Measure what one decode step costs with and without the cache, as the sequence grows.

Without a cache, step n runs all n tokens through the model again: cost grows linearly per step, so a
whole answer is O(n^2). With the cache, step n runs one token and reads n cached K/V rows: the model's
weights dominate and the cost stays nearly flat.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .kv_cache import KVCache
from .model import Transformer


@dataclass(frozen=True)
class StepCost:
    context_len: int
    cached_s: float  # one new token, context_len tokens already cached
    uncached_s: float  # the whole context_len + 1 tokens recomputed


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@torch.inference_mode()
def step_costs(model: Transformer, context_lens: list[int], repeats: int = 3, seed: int = 0) -> list[StepCost]:
    """Best-of-`repeats` wall time of one decode step at each context length (random token ids). The
    repeats go round all the lengths in turn, so a burst of load on the machine spoils one sample of
    several points rather than every sample of one."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for n in context_lens:
        ids = torch.randint(0, cfg.vocab_size, (n + 1,), generator=gen)
        cache = KVCache(cfg, n + 1, model.dtype, model.device)
        model(ids[:n], torch.arange(n), cache)
        cache.advance(n)

        def cached_step(ids=ids, n=n, cache=cache):
            cache.length = n  # overwrite the same slot each repeat
            model(ids[n:], torch.tensor([n]), cache)

        steps.append((cached_step, lambda ids=ids, n=n: model(ids, torch.arange(n + 1))))
    best = [[float("inf")] * 2 for _ in context_lens]
    for _ in range(repeats):
        for row, fns in zip(best, steps):
            row[:] = [min(b, _timed(fn)) for b, fn in zip(row, fns)]
    return [StepCost(n, cached, uncached) for n, (cached, uncached) in zip(context_lens, best)]


def format_costs(rows: list[StepCost]) -> str:
    lines = [f"{'context':>8} {'cached ms/tok':>14} {'uncached ms/tok':>16} {'ratio':>7}"]
    for r in rows:
        lines.append(f"{r.context_len:>8} {r.cached_s * 1e3:>14.2f} {r.uncached_s * 1e3:>16.2f} "
                     f"{r.uncached_s / r.cached_s:>6.1f}x")
    return "\n".join(lines)
