"""Chapter 2's engine on a one-token-per-slot pool, with the radix cache switched on or off.

Only two hooks change: the KV cache manager (a RadixKVCacheManager, or step02's plain one for "off") and the
sequence type (which carries `last_node`). The scheduler, the attention and the model are step02's, unchanged:
with block_size 1 a "block" is a slot and a block table is the list of a request's slots (SGLang's
req_to_token row).
"""
from __future__ import annotations

from dataclasses import dataclass

from step01_kvcache.generate import SamplingParams
from step02_paged.engine import Engine, EngineConfig
from step02_paged.kv_cache_manager import KVCacheManager
from step02_paged.paged_attention import PagedAttention

from .radix_cache import RadixKVCacheManager, RadixSequence
from .radix_tree import RadixTree


@dataclass(frozen=True)
class RadixEngineConfig(EngineConfig):
    """`num_blocks` counts slots (one token each); block_size must stay 1."""

    num_blocks: int = 4096
    block_size: int = 1
    enable_radix_cache: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_size != 1:
            raise ValueError(f"the radix engine stores one token per slot: block_size must be 1, got "
                             f"{self.block_size} (chapter 5 bridges a token tree to bigger blocks)")

    @property
    def num_slots(self) -> int:
        return self.num_blocks


class RadixEngine(Engine):
    cache_class = RadixKVCacheManager  # chapter 5 swaps in its block-level bridge

    def __init__(self, model, config: RadixEngineConfig = RadixEngineConfig(),
                 attention: type[PagedAttention] = PagedAttention) -> None:
        if not isinstance(config, RadixEngineConfig):
            raise TypeError(f"RadixEngine needs a RadixEngineConfig, got {type(config).__name__}")
        super().__init__(model, config, attention)

    def _make_kv_cache_manager(self) -> KVCacheManager:
        cfg = self.config
        if cfg.enable_radix_cache:
            return self.cache_class(cfg.num_blocks, cfg.block_size)
        return KVCacheManager(cfg.num_blocks, cfg.block_size)

    def _make_sequence(self, seq_id: int, prompt_ids: list[int], params: SamplingParams) -> RadixSequence:
        return RadixSequence(seq_id, prompt_ids, params)

    @property
    def tree(self) -> RadixTree | None:
        """The radix tree, or None with the cache off."""
        return self.kv.tree if isinstance(self.kv, RadixKVCacheManager) else None

    def check_invariants(self) -> None:
        super().check_invariants()
        for seq in self.scheduler.waiting:
            assert seq.last_node is None and seq.cache_protected_len == 0, \
                f"waiting sequence {seq.seq_id} still locks the tree"
        if not self.has_unfinished() and self.tree is not None:
            assert self.tree.protected_size == 0, "a drained engine still holds tree locks"
            assert self.kv.block_manager.num_free + len(self.tree.all_slots()) == self.config.num_blocks, \
                f"a drained engine leaked {self.tree.value_name}: free + cached != pool"
