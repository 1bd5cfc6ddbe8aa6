"""The course's engine on a GPU: `make_engine` picks a chapter's cache manager, the attention backend, CUDA-graph
decode and overlap scheduling, each one option.

Nothing above the KV store changes: the scheduler, chunked prefill, preemption and every prefix cache of
chapters 3-5 run as they did, because they only ever produced block tables and the attention only ever read
them. `cuda_graphs=True` replays decode steps from CUDA graphs (GPU only; see cuda_graph.py); `overlap=True`
schedules step N+1 while step N runs (chapter 2's engine, `EngineConfig.overlap`).
"""
from __future__ import annotations

import functools

from step01_kvcache.model import Transformer
from step02_paged import Engine, EngineConfig, KVCacheManager
from step02_paged.paged_attention import PagedAttention
from step03_prefix_hash import PrefixCachingKVCacheManager
from step04_radix import RadixKVCacheManager
from step04_radix.policy import make_policy
from step05_bridge import BridgeKVCacheManager

from .cuda_graph import CUDAGraphModel
from .triton_attention import TritonPagedAttention

BACKENDS = {"torch": PagedAttention, "triton": TritonPagedAttention}
PREFIX_CACHES = {  # the cache manager of each chapter
    "none": KVCacheManager,  # chapter 2: paging only
    "hash": PrefixCachingKVCacheManager,  # chapter 3
    "radix": RadixKVCacheManager,  # chapter 4 (one token per slot: block_size 1)
    "bridge": BridgeKVCacheManager,  # chapter 5, the default: the last chapter's engine
}


def make_engine(model: Transformer, prefix_cache: str = "bridge", attention_backend: str = "triton",
                cuda_graphs: bool = False, fuse: bool = False, host_blocks: int = 0, policy: str = "fcfs",
                **config) -> Engine:
    """Chapter 2's engine with chapter `prefix_cache`'s manager, `config` (EngineConfig's fields, `overlap`
    among them), on `attention_backend`; `cuda_graphs` (with `fuse`: the fused decode step) on a GPU;
    `host_blocks` > 0 puts chapter 5's host tier under the bridge; `policy` orders the waiting queue (chapter 4's
    `fcfs`, `lpm` or `dfs-weight`, the last on a tree design only)."""
    if attention_backend not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {sorted(BACKENDS)}, got {attention_backend!r}")
    if prefix_cache not in PREFIX_CACHES:
        raise ValueError(f"prefix_cache must be one of {sorted(PREFIX_CACHES)}, got {prefix_cache!r}")
    if cuda_graphs and attention_backend != "triton":
        raise ValueError("cuda_graphs replays the Triton decode step: use attention_backend='triton'")
    if fuse and not cuda_graphs:
        raise ValueError("fuse applies to the captured decode step: use cuda_graphs=True")
    if host_blocks and prefix_cache != "bridge":
        raise ValueError("the host tier is chapter 5's: use prefix_cache='bridge' with host_blocks")
    if policy == "dfs-weight" and prefix_cache in ("none", "hash"):
        raise ValueError(f"policy 'dfs-weight' walks a radix tree; prefix_cache {prefix_cache!r} has none")
    order = make_policy(policy)  # a ValueError names the policies
    manager = functools.partial(BridgeKVCacheManager, host_blocks=host_blocks) if host_blocks else \
        PREFIX_CACHES[prefix_cache]
    graphed = CUDAGraphModel(model) if cuda_graphs else None
    engine = Engine(graphed or model, EngineConfig(**config), manager, BACKENDS[attention_backend], order)
    if graphed:
        graphed.capture(engine, fuse=fuse)
    return engine
