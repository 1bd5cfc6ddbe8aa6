"""`python -m course bench step03 --workload short|long|shared_prefix [--json]`.

The cache off/on runner every prefix-caching chapter shares (benchmarks.runner.prefix_cache_bench), plus what this
chapter adds: per-round hit rates (per request as the mini-vllm tutorial counts them: a request hits when it
reuses at least one block), the cost of hashing per token, and the cost of looking up an already hashed 2k-token
prompt.
"""
from __future__ import annotations

import argparse
import timeit

from benchmarks.runner import prefix_cache_bench, register
from step01_kvcache.request import SamplingParams
from step02_paged import Engine, EngineConfig, KVCacheManager
from step02_paged.cache_manager import PrefixMatch
from step02_paged.geometry import PoolGeometry, cdiv
from step02_paged.scheduler import admit
from step03_prefix_hash.kv_cache_manager import PrefixCachingKVCacheManager
from step03_prefix_hash.sequence import HashedSequence

BLOCK_SIZE = 16


@register("step03")
def bench_step03(args: argparse.Namespace) -> dict:
    from course.workloads import get_workload
    from step01_kvcache.pretrained import load_tokenizer

    workload = get_workload(args.workload or "short")
    prompts = workload.prompts(load_tokenizer(args.model))
    # room for one round at once with the cache off (the concurrent pass), so memory is measured, not preemption
    new_tokens = args.max_new_tokens or 8  # prefix_cache_bench's default
    num_blocks = max(256, sum(cdiv(len(p) + new_tokens, BLOCK_SIZE) for p in prompts) + 8)
    managers = []  # the cache managers (not the engines: their pools are large)

    def make_engine(model, on: bool) -> Engine:
        engine = Engine(model, EngineConfig(num_blocks=num_blocks, block_size=BLOCK_SIZE),
                        PrefixCachingKVCacheManager if on else KVCacheManager)
        managers.append(engine.cache_manager)
        return engine

    result = prefix_cache_bench("step03", make_engine, args)
    # the sequential pass with the cache on: it serves every round, and comes before the concurrent pass
    # (max keeps the first of equals)
    sequential = max((kv for kv in managers if isinstance(kv, PrefixCachingKVCacheManager)),
                     key=lambda kv: kv.stats.requests)
    result["evicted_blocks"] = sequential.block_manager.num_evicted
    result.update(micro_benchmarks())
    return result


# ---- micro-benchmarks ---------------------------------------------------------------------------------

def micro_benchmarks(num_tokens: int = 2048) -> dict:
    return dict(hash_us_per_token=round(hash_seconds_per_token(num_tokens) * 1e6, 4),
                hash_builtin_us_per_token=round(builtin_hash_seconds_per_token(num_tokens) * 1e6, 4),
                lookup_2k_ms=round(lookup_seconds(num_tokens) * 1e3, 4))


def hash_seconds_per_token(num_tokens: int = 2048, block_size: int = BLOCK_SIZE) -> float:
    """What the engine pays per prompt token: a HashedSequence hashing its full blocks on arrival."""
    tokens = list(range(num_tokens))
    params = SamplingParams(max_new_tokens=1)
    make = lambda: HashedSequence(0, tokens, params, block_size=block_size)
    return min(timeit.repeat(make, number=3, repeat=5)) / 3 / num_tokens


def builtin_hash_seconds_per_token(num_tokens: int = 2048, block_size: int = BLOCK_SIZE) -> float:
    """The same chain with Python's 64-bit hash() of a tuple, for comparison (see block_hash.py for why not)."""
    tokens = list(range(num_tokens))

    def chain() -> None:
        parent = 0
        for i in range(num_tokens // block_size):
            parent = hash((parent, tuple(tokens[i * block_size: (i + 1) * block_size])))

    return min(timeit.repeat(chain, number=3, repeat=5)) / 3 / num_tokens


def lookup_seconds(num_tokens: int = 2048, block_size: int = BLOCK_SIZE) -> float:
    """get_computed_blocks on an already hashed prompt whose blocks are all cached (and free)."""
    kv = PrefixCachingKVCacheManager(PoolGeometry(num_tokens // block_size + 2, block_size))
    tokens, params = list(range(num_tokens)), SamplingParams(max_new_tokens=1)
    first = kv.new_sequence(0, tokens, params)
    assert kv.allocate_slots(first, num_tokens)
    admit(kv, first, PrefixMatch())
    first.advance(num_tokens)
    kv.on_computed(first)
    kv.free(first)
    probe = kv.new_sequence(1, tokens, params)
    match = kv.get_computed_blocks(probe)
    assert match.num_tokens == len(match.blocks) * block_size == (num_tokens - 1) // block_size * block_size
    return min(timeit.repeat(lambda: kv.get_computed_blocks(probe), number=200, repeat=5)) / 200
