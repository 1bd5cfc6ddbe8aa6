"""Chapter 2: a paged KV pool, block tables and a continuous-batching engine with chunked prefill."""
from .block_manager import BlockManager, OutOfBlocksError
from .engine import Engine, EngineConfig, RequestOutput
from .kv_cache_manager import KVCacheManager
from .kv_pool import KVPool
from .scheduler import Scheduler, SchedulerConfig
from .sequence import Sequence, SequenceStatus

__all__ = ["BlockManager", "Engine", "EngineConfig", "KVCacheManager", "KVPool", "OutOfBlocksError",
           "RequestOutput", "Scheduler", "SchedulerConfig", "Sequence", "SequenceStatus"]
