"""The course's engine with its attention on the Triton kernels: one option, `attention_backend`.

Nothing above the KV store changes: the scheduler, chunked prefill, preemption and every prefix cache of
chapters 3-5 run as they did, because they only ever produced block tables and the attention only ever read
them. `cuda_graphs=True` also replays decode steps from CUDA graphs (GPU only; see cuda_graph.py).
"""
from __future__ import annotations

from step01_kvcache.model import Transformer
from step02_paged import Engine, EngineConfig, KVCacheManager
from step02_paged.paged_attention import PagedAttention
from step03_prefix_hash import PrefixCachingKVCacheManager
from step04_radix import RadixKVCacheManager
from step05_bridge import PrefixCache

from .cuda_graph import CUDAGraphModel
from .triton_attention import TritonPagedAttention

BACKENDS = {"torch": PagedAttention, "triton": TritonPagedAttention}
PREFIX_CACHES = {  # the cache manager of each chapter
    "none": KVCacheManager,  # chapter 2: paging only
    "hash": PrefixCachingKVCacheManager,  # chapter 3
    "radix": RadixKVCacheManager,  # chapter 4 (one token per slot: block_size 1)
    "bridge": PrefixCache,  # chapter 5, the default: the last chapter's engine
}


def make_engine(model: Transformer, prefix_cache: str = "bridge", attention_backend: str = "triton",
                cuda_graphs: bool = False, **config) -> Engine:
    """Chapter 2's engine with chapter `prefix_cache`'s manager, `config` (EngineConfig's fields), on
    `attention_backend`."""
    if attention_backend not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {sorted(BACKENDS)}, got {attention_backend!r}")
    if prefix_cache not in PREFIX_CACHES:
        raise ValueError(f"prefix_cache must be one of {sorted(PREFIX_CACHES)}, got {prefix_cache!r}")
    if cuda_graphs and attention_backend != "triton":
        raise ValueError("cuda_graphs replays the Triton decode step: use attention_backend='triton'")
    cfg = EngineConfig(**config)
    graphed = CUDAGraphModel(model) if cuda_graphs else None
    engine = Engine(graphed or model, cfg, PREFIX_CACHES[prefix_cache], BACKENDS[attention_backend])
    if graphed:
        graphed.capture(engine.pool, cfg.max_num_seqs, model.config.max_position_embeddings)
    return engine
