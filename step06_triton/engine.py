"""The course's engine on a GPU: `make_engine` picks a chapter's cache manager, the attention backend, CUDA-graph
replay and overlap scheduling, each one option.

Nothing above the KV store changes: the scheduler, chunked prefill, preemption and every prefix cache of
chapters 3-5 run as they did, because they only ever produced block tables and the attention only ever read
them. `cuda_graphs=True` gives the engine a runner that replays decode steps from CUDA graphs (GPU only; see
cuda_graph.py); `compile=True` one that runs the model compiled by torch.compile (compiled_runner.py);
`overlap=True` makes it chapter 2's engine with its step overlapped (overlap.py).
"""
from __future__ import annotations

import functools

from step01_kvcache.model import Transformer
from step02_paged import Engine, EngineConfig, KVCacheManager
from step02_paged.model_runner import ModelRunner
from step02_paged.paged_attention import PagedAttention
from step03_prefix_hash import PrefixCachingKVCacheManager
from step04_radix import RadixKVCacheManager
from step04_radix.policy import make_policy
from step05_bridge import BridgeKVCacheManager, OffsetKVCacheManager, SpeculativeConfig, SpeculativeEngine

from .cascade_policy import MIN_SEQS, MIN_TOKENS, CascadePolicy
from .compiled_runner import CompiledRunner
from .cuda_graph import EXTEND_SIZES, CUDAGraphRunner
from .fp8_pool import KVScales, kv_pool
from .overlap import OverlapEngine, check_no_speculation
from .triton_attention import TritonPagedAttention

BACKENDS = {"torch": PagedAttention, "triton": TritonPagedAttention}
PREFIX_CACHES = {  # the cache manager of each chapter
    "none": KVCacheManager,  # chapter 2: paging only
    "hash": PrefixCachingKVCacheManager,  # chapter 3
    "radix": RadixKVCacheManager,  # chapter 4 (one token per slot: block_size 1)
    "bridge": BridgeKVCacheManager,  # chapter 5, the default: the last chapter's engine
    "offset": OffsetKVCacheManager,  # chapter 5's last section: the mini-runtime textbook's block tree
}


def make_engine(model: Transformer, prefix_cache: str = "bridge", attention_backend: str = "triton",
                cuda_graphs: bool = False, fuse: bool = False, overlap: bool = False, cascade: bool = False,
                host_blocks: int = 0, policy: str = "fcfs", cascade_min_tokens: int = MIN_TOKENS,
                cascade_min_seqs: int = MIN_SEQS, kv_cache_dtype: str = "auto", kv_scales: KVScales | None = None,
                num_speculative_tokens: int = 0, compile: bool = False, **config) -> Engine:
    """Chapter 2's engine (`overlap`: chapter 6's `OverlapEngine`) with chapter `prefix_cache`'s manager, `config`
    (EngineConfig's fields), on `attention_backend`; `cuda_graphs` (with `fuse`: the fused decode step) on a GPU;
    `cascade`: decode steps read each prefix shared by `cascade_min_seqs` rows or more, `cascade_min_tokens` long
    or more, once (Triton only); `host_blocks` > 0 puts chapter 5's host tier under the bridge; `policy` orders
    the waiting queue (chapter 4's `fcfs`, `lpm` or `dfs-weight`); `kv_cache_dtype` ("auto" or "fp8_e4m3") and
    `kv_scales` choose the pool (fp8_pool.py); `num_speculative_tokens` > 0 verifies that many prompt-lookup guesses
    per decode step (chapter 5's `SpeculativeEngine`); `compile`: the model compiled by torch.compile, attention a
    custom op (compiled_runner.py; with `cuda_graphs`, the graphs capture the compiled step). Every option is checked
    before anything is built."""
    if attention_backend not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {sorted(BACKENDS)}, got {attention_backend!r}")
    if prefix_cache not in PREFIX_CACHES:
        raise ValueError(f"prefix_cache must be one of {sorted(PREFIX_CACHES)}, got {prefix_cache!r}")
    for name, value in (("cuda_graphs", cuda_graphs), ("fuse", fuse), ("overlap", overlap), ("cascade", cascade),
                        ("compile", compile)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if cascade and attention_backend != "triton":
        raise ValueError("cascade attention is a Triton kernel: use attention_backend='triton'")
    if cuda_graphs and attention_backend != "triton":
        raise ValueError("cuda_graphs replays the Triton decode step: use attention_backend='triton'")
    if fuse and not cuda_graphs:
        raise ValueError("fuse applies to the captured decode step: use cuda_graphs=True")
    if compile and fuse:
        raise ValueError("fuse is the hand-fused step, compile lets the compiler fuse the same code: use one of them")
    if host_blocks and prefix_cache != "bridge":
        raise ValueError("the host tier is chapter 5's: use prefix_cache='bridge' with host_blocks")
    speculative = SpeculativeConfig(num_speculative_tokens) if num_speculative_tokens else None
    if speculative and overlap:
        check_no_speculation(num_speculative_tokens)
    if cascade and speculative:
        raise ValueError("cascade attention with speculative decoding is not built: a verify step's rows read the "
                         "shared prefix at several positions; use cascade=False or num_speculative_tokens=0")
    # a ValueError names a bad threshold
    prefix_groups = CascadePolicy(cascade_min_tokens, cascade_min_seqs) if cascade else None
    pool = kv_pool(kv_cache_dtype, kv_scales)  # a ValueError names the dtypes
    order = make_policy(policy)  # a ValueError names the policies; the engine's scheduler checks the pairing
    engine_config = EngineConfig(**config)
    manager = functools.partial(BridgeKVCacheManager, host_blocks=host_blocks) if host_blocks else \
        PREFIX_CACHES[prefix_cache]
    runner = CompiledRunner if compile else \
        functools.partial(CUDAGraphRunner, fuse=fuse) if cuda_graphs else ModelRunner
    args = (model, engine_config, manager, BACKENDS[attention_backend], order, runner)
    if speculative:
        engine = SpeculativeEngine(*args, pool=pool, speculative=speculative)
    else:
        engine = (OverlapEngine if overlap else Engine)(*args, pool=pool, cascade=prefix_groups)
    if cuda_graphs:
        engine.runner.capture(engine.block_table.device_table, engine.config.max_num_seqs,
                              max_extend=min(EXTEND_SIZES[-1], engine.config.max_num_batched_tokens),
                              cascade_min_seqs=cascade_min_seqs if cascade else None)
    return engine
