"""Chapter 4: SGLang's token-level radix tree (one token per KV slot) as the engine's prefix cache."""
from .engine import RadixEngine, RadixEngineConfig
from .radix_cache import RadixKVCacheManager, RadixSequence
from .radix_tree import RadixTree, TreeNode, common_prefix_len

__all__ = ["RadixEngine", "RadixEngineConfig", "RadixKVCacheManager", "RadixSequence", "RadixTree", "TreeNode",
           "common_prefix_len"]
