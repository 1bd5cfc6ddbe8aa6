"""The course's engine with its attention on the Triton kernels: one option, `attention_backend`.

Nothing above the KV store changes: the scheduler, chunked prefill, preemption and every prefix cache of
chapters 3-5 run as they did, because they only ever produced block tables and the attention only ever read
them. `cuda_graphs=True` also replays decode steps from CUDA graphs (GPU only; see cuda_graph.py).
"""
from __future__ import annotations

from step01_kvcache.model import Transformer
from step02_paged.engine import Engine, EngineConfig
from step02_paged.paged_attention import PagedAttention
from step03_prefix_hash.engine import Engine as HashEngine
from step03_prefix_hash.engine import EngineConfig as HashEngineConfig
from step04_radix.engine import RadixEngine, RadixEngineConfig
from step05_bridge.engine import BridgeEngine, BridgeEngineConfig

from .cuda_graph import CUDAGraphModel
from .triton_attention import TritonPagedAttention

BACKENDS = {"torch": PagedAttention, "triton": TritonPagedAttention}
PREFIX_CACHES = {  # chapter: engine class, its config class
    "none": (Engine, EngineConfig),  # chapter 2: paging only
    "hash": (HashEngine, HashEngineConfig),  # chapter 3
    "radix": (RadixEngine, RadixEngineConfig),  # chapter 4 (one token per slot)
    "bridge": (BridgeEngine, BridgeEngineConfig),  # chapter 5 (the default, as the last chapter's engine)
}


def make_engine(model: Transformer, prefix_cache: str = "bridge", attention_backend: str = "triton",
                cuda_graphs: bool = False, **config) -> Engine:
    """An engine of chapter `prefix_cache`'s design with `config` (its config's fields) on `attention_backend`."""
    if attention_backend not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {sorted(BACKENDS)}, got {attention_backend!r}")
    if prefix_cache not in PREFIX_CACHES:
        raise ValueError(f"prefix_cache must be one of {sorted(PREFIX_CACHES)}, got {prefix_cache!r}")
    if cuda_graphs and attention_backend != "triton":
        raise ValueError("cuda_graphs replays the Triton decode step: use attention_backend='triton'")
    engine_class, config_class = PREFIX_CACHES[prefix_cache]
    cfg = config_class(**config)
    graphed = CUDAGraphModel(model) if cuda_graphs else None
    engine = engine_class(graphed or model, cfg, attention=BACKENDS[attention_backend])
    if graphed:
        graphed.capture(engine.pool, cfg.max_num_seqs, model.config.max_position_embeddings)
    return engine
