"""Chapter 2: a paged KV pool, block tables and a continuous-batching engine with chunked prefill."""
from .block_manager import BlockManager, OutOfBlocksError
from .cache_manager import CacheManager, PrefixMatch
from .config import EngineConfig
from .engine import Engine, RequestOutput
from .geometry import PoolGeometry, cdiv
from .kv_cache_manager import KVCacheManager
from .kv_pool import KVPool
from .model_runner import ModelRunner
from .scheduler import FCFS, Policy, Scheduler
from .sequence import Sequence, SequenceStatus

__all__ = ["FCFS", "BlockManager", "CacheManager", "Engine", "EngineConfig", "KVCacheManager", "KVPool",
           "ModelRunner", "OutOfBlocksError", "Policy", "PoolGeometry", "PrefixMatch", "RequestOutput",
           "Scheduler", "Sequence", "SequenceStatus", "cdiv"]
