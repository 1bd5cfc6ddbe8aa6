"""Chapter 5: seed 000's bridge - a token-level radix tree over a block-level BlockManager, two reference counts."""
from .block_radix_tree import BlockRadixTree
from .engine import BridgeEngine, BridgeEngineConfig
from .prefix_cache import PrefixCache

__all__ = ["BlockRadixTree", "BridgeEngine", "BridgeEngineConfig", "PrefixCache"]
