"""Chapter 2's engine with a prefix cache: the scheduler, model, pool and step loop are unchanged.

Only two factories differ: the KV cache manager (hash lookups, publishing, LRU reuse) and the sequence
(which hashes its blocks as they fill). With `enable_prefix_caching=False` the engine is chapter 2's
with plain sequences, so the bench compares the two in one process.
"""
from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, fields, replace

import torch

from step01_kvcache.generate import SamplingParams
from step01_kvcache.model import Transformer
from step02_paged import engine as paged
from step02_paged.paged_attention import PagedAttention
from step02_paged.sequence import Sequence

from .kv_cache_manager import PrefixCachingKVCacheManager
from .sequence import HashedSequence


@dataclass(frozen=True)
class EngineConfig(paged.EngineConfig):
    enable_prefix_caching: bool = True


class Engine(paged.Engine):
    """`Engine(model, config, prefix_caching=None)`: the flag, when given, overrides the config's."""

    kv: PrefixCachingKVCacheManager
    config: EngineConfig

    def __init__(self, model: Transformer, config: paged.EngineConfig = EngineConfig(),
                 prefix_caching: bool | None = None, attention: type[PagedAttention] = PagedAttention) -> None:
        if not isinstance(config, EngineConfig):  # a chapter 2 config: same fields, caching on
            config = EngineConfig(**{f.name: getattr(config, f.name) for f in fields(paged.EngineConfig)})
        if prefix_caching is not None:
            config = replace(config, enable_prefix_caching=prefix_caching)
        self._salt: str | None = None
        super().__init__(model, config, attention)

    @property
    def prefix_caching(self) -> bool:
        return self.config.enable_prefix_caching

    def _make_kv_cache_manager(self) -> PrefixCachingKVCacheManager:
        cfg = self.config
        return PrefixCachingKVCacheManager(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching)

    def _make_sequence(self, seq_id: int, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        if not self.prefix_caching:
            return super()._make_sequence(seq_id, prompt_ids, params)
        return HashedSequence(seq_id, prompt_ids, params, block_size=self.config.block_size, cache_salt=self._salt)

    def add_request(self, prompt_ids: Seq[int] | torch.Tensor, params: SamplingParams = SamplingParams(),
                    cache_salt: str | None = None) -> int:
        """Chapter 2's, plus an optional cache salt: only requests with the same salt share blocks."""
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"cache_salt must be a string, got {type(cache_salt).__name__}")
        self._salt = cache_salt  # read by _make_sequence, which add_request calls
        try:
            return super().add_request(prompt_ids, params)
        finally:
            self._salt = None

    def reset_prefix_cache(self) -> int:
        """Forget every cached block (after a weight update, or between benchmark runs). Only when idle:
        RuntimeError, with nothing changed, while requests hold blocks."""
        return self.kv.reset()

    def check_invariants(self) -> None:
        super().check_invariants()
        for seq in self.scheduler.waiting:
            if isinstance(seq, HashedSequence):
                seq.check_invariants()
