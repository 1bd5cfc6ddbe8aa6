"""Chapter 4: SGLang's token-level radix tree (one token per KV slot) as the engine's prefix cache.

`Engine(model, EngineConfig(block_size=1, ...), RadixKVCacheManager)` is chapter 2's engine with this cache."""
from .radix_cache import RadixKVCacheManager, RadixSequence, TreeMatch
from .radix_tree import RadixTree, TreeNode, common_prefix_len

__all__ = ["RadixKVCacheManager", "RadixSequence", "RadixTree", "TreeMatch", "TreeNode", "common_prefix_len"]
