"""Shared helpers for chapter 3's tests: hashed sequences driven by hand, and the prefix-caching engine."""
from __future__ import annotations

import random

from step01_kvcache.generate import SamplingParams
from step02_paged import Engine, EngineConfig
from step02_paged.scheduler import admit as admit_after_match
from step03_prefix_hash import HashedSequence, PrefixCachingKVCacheManager


def hseq(seq_id: int, tokens: list[int], block_size: int = 4, salt: str | None = None) -> HashedSequence:
    return HashedSequence(seq_id, list(tokens), SamplingParams(max_new_tokens=64), block_size=block_size,
                          cache_salt=salt)


def admit(kv: PrefixCachingKVCacheManager, seq: HashedSequence) -> int:
    """What the scheduler does on admission: look up, then allocate the rest of the prompt. Returns hit tokens."""
    match = kv.get_computed_blocks(seq)
    assert kv.allocate_slots(seq, seq.num_tokens - match.num_tokens, match), "the pool was meant to be large enough"
    admit_after_match(kv, seq, match)
    return match.num_tokens


def compute(kv: PrefixCachingKVCacheManager, seq: HashedSequence, upto: int | None = None) -> None:
    """What a forward does: K/V of tokens up to `upto` now exist; the manager publishes full blocks."""
    seq.advance((seq.num_tokens if upto is None else upto) - seq.num_computed_tokens)
    kv.on_computed(seq)


def prefilled(kv: PrefixCachingKVCacheManager, seq_id: int, tokens: list[int], block_size: int = 4,
              salt: str | None = None) -> HashedSequence:
    """A request admitted and run through its whole prompt: its full blocks are now published."""
    seq = hseq(seq_id, tokens, block_size, salt)
    admit(kv, seq)
    compute(kv, seq)
    return seq


def snapshot(kv: PrefixCachingKVCacheManager):
    bm = kv.block_manager
    return list(bm.ref_count), list(bm.free_blocks), dict(bm.cached), [list(s.block_table) for s in kv.holders.values()]


def shared_prefix_prompts(n: int, seed: int, block_size: int = 4, vocab: int = 256) -> list[list[int]]:
    """Ragged prompts drawn from a few shared stems (ending on and off block boundaries), plus exact repeats."""
    rng = random.Random(seed)
    stems = [[rng.randrange(vocab) for _ in range(k)] for k in (3 * block_size, 5 * block_size + 2, 7)]
    prompts = []
    for _ in range(n):
        if prompts and rng.random() < 0.2:
            prompts.append(list(rng.choice(prompts)))  # an exact repeat: a full hit, the last token recomputed
        else:
            stem = rng.choice(stems)
            prompts.append(stem[: rng.randint(1, len(stem))] + [rng.randrange(vocab) for _ in range(rng.randint(0, 9))])
    return prompts


def cached_engine(model, num_speculative_tokens: int = 0, **config) -> Engine:
    """Chapter 2's engine with this chapter's cache manager (chapter 5's SpeculativeEngine when it asks for guesses)."""
    from tests.driver import engine_for

    return engine_for(model, EngineConfig(**config), PrefixCachingKVCacheManager,
                      num_speculative_tokens=num_speculative_tokens)
