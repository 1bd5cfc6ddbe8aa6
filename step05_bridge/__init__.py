"""Chapter 5: the Pico-vLLM write-up's bridge - a token-level radix tree over a block-level BlockManager, two
reference counts.

`Engine(model, EngineConfig(block_size=16, ...), BridgeKVCacheManager)` is chapter 2's engine with this cache;
`OffsetKVCacheManager` in its place runs the mini-runtime textbook's block radix tree with offsets;
`SpeculativeEngine(model, config, manager, speculative=SpeculativeConfig(k))` is chapter 2's engine verifying k
guessed tokens a step over any of the caches."""
from .block_radix_tree import BlockRadixTree
from .bridge_cache import BridgeKVCacheManager
from .offset_cache import OffsetKVCacheManager
from .speculative_config import SpeculativeConfig
from .speculative_engine import SpeculativeEngine

__all__ = ["BlockRadixTree", "BridgeKVCacheManager", "OffsetKVCacheManager", "SpeculativeConfig", "SpeculativeEngine"]
