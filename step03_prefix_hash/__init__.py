"""Chapter 3: a vLLM-style prefix cache — chained hashes of full blocks, a hash -> block map, an LRU free queue.

`Engine(model, config, PrefixCachingKVCacheManager)` is chapter 2's engine with this cache."""
from .block_hash import NONE_HASH, BlockHash, hash_block_tokens, hash_token_blocks
from .block_manager import CacheEntry, PrefixCachingBlockManager
from .free_queue import FreeBlockQueue
from .kv_cache_manager import PrefixCachingKVCacheManager
from .sequence import HashedSequence

__all__ = ["NONE_HASH", "BlockHash", "CacheEntry", "FreeBlockQueue", "HashedSequence",
           "PrefixCachingBlockManager", "PrefixCachingKVCacheManager", "hash_block_tokens", "hash_token_blocks"]
