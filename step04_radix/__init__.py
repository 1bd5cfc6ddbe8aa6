"""Chapter 4: SGLang's token-level radix tree (one token per KV slot) as the engine's prefix cache.

`Engine(model, EngineConfig(block_size=1, ...), RadixKVCacheManager)` is chapter 2's engine with this cache."""
from .radix_cache import RadixKVCacheManager
from .radix_tree import RadixTree, TreeNode, common_prefix_len
from .tree_cache import RadixSequence, TreeCacheManager, TreeMatch

__all__ = ["RadixKVCacheManager", "RadixSequence", "RadixTree", "TreeCacheManager", "TreeMatch", "TreeNode",
           "common_prefix_len"]
