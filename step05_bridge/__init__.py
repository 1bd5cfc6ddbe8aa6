"""Chapter 5: the Pico-vLLM write-up's bridge - a token-level radix tree over a block-level BlockManager, two
reference counts.

`Engine(model, EngineConfig(block_size=16, ...), BridgeKVCacheManager)` is chapter 2's engine with this cache."""
from .block_radix_tree import BlockRadixTree
from .bridge_cache import BridgeKVCacheManager

__all__ = ["BlockRadixTree", "BridgeKVCacheManager"]
