"""Chapter 2's engine with seed 000's bridge: a token radix tree over blocks of any size.

Nothing of the engine is new. It is chapter 4's RadixEngine with its cache class swapped for the PrefixCache
bridge and the one-token-per-slot rule lifted: `block_size` is 16 by default, as in vLLM, and 1 gives
chapter 4's granularity back (with chapter 5's reference counting).
"""
from __future__ import annotations

from dataclasses import dataclass

from step02_paged.engine import EngineConfig
from step02_paged.paged_attention import PagedAttention
from step04_radix.engine import RadixEngine, RadixEngineConfig

from .prefix_cache import PrefixCache


@dataclass(frozen=True)
class BridgeEngineConfig(RadixEngineConfig):
    num_blocks: int = 256
    block_size: int = 16

    def __post_init__(self) -> None:
        EngineConfig.__post_init__(self)  # any block size: bridging the two granularities is the point


class BridgeEngine(RadixEngine):
    cache_class = PrefixCache

    def __init__(self, model, config: BridgeEngineConfig = BridgeEngineConfig(),
                 attention: type[PagedAttention] = PagedAttention) -> None:
        if not isinstance(config, BridgeEngineConfig):
            raise TypeError(f"BridgeEngine needs a BridgeEngineConfig, got {type(config).__name__}")
        super().__init__(model, config, attention)
