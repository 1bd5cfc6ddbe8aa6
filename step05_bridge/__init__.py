"""Chapter 5: the Pico-vLLM write-up's bridge - a token-level radix tree over a block-level BlockManager, two
reference counts.

`Engine(model, EngineConfig(block_size=16, ...), PrefixCache)` is chapter 2's engine with this cache."""
from .block_radix_tree import BlockRadixTree
from .prefix_cache import PrefixCache

__all__ = ["BlockRadixTree", "PrefixCache"]
