"""`python -m course bench step04 --workload <name> [--json]`: the engine on one-token slots with the radix cache
off and on (through benchmarks.runner.prefix_cache_bench, as every prefix-caching chapter), plus the cost of the
tree's bookkeeping. `python -m course report` sets its results beside chapter 3's, workload by workload.

`--workload multi_doc` compares the waiting-queue policies instead (policies.py), on chapter 3's hash and
this chapter's tree."""
from __future__ import annotations

import argparse
import random
import time
from statistics import median

from benchmarks.runner import prefix_cache_bench, register
from course.workloads import get_workload
from step02_paged import Engine, EngineConfig, KVCacheManager
from step04_radix.radix_cache import RadixKVCacheManager
from step04_radix.radix_tree import RadixTree

from . import policies

BOOKKEEPING_BUDGET_US = 100.0  # match + lock + insert + unlock of a 2k-token request


def pool_slots(workload: str, max_new_tokens: int) -> int:
    """Enough slots for one round of the workload at once with the cache off (no preemption skews memory)."""
    from step01_kvcache.pretrained import load_tokenizer

    prompts = get_workload(workload).prompts(load_tokenizer())
    return sum(len(p) + max_new_tokens for p in prompts) + 64


@register("step04")
def bench_step04(args: argparse.Namespace) -> dict:
    if args.workload == policies.WORKLOAD:
        from step03_prefix_hash import PrefixCachingKVCacheManager

        return policies.compare_policies("step04", {"hash": (PrefixCachingKVCacheManager, 16),
                                                        "radix": (RadixKVCacheManager, 1)}, args)
    args.workload = args.workload or "short"
    args.max_new_tokens = args.max_new_tokens or 8
    slots = pool_slots(args.workload, args.max_new_tokens)
    on_engines: list[Engine] = []

    def make_engine(model, on: bool) -> Engine:
        engine = Engine(model, EngineConfig(num_blocks=slots, block_size=1),
                        RadixKVCacheManager if on else KVCacheManager)
        if on:
            on_engines.append(engine)
        return engine

    result = prefix_cache_bench("step04", make_engine, args)
    sequential = on_engines[0]  # the engine of the sequential pass over every round
    sequential.check_invariants()
    kv = sequential.cache_manager
    result.update(pool_slots=slots, tree_nodes=kv.tree.num_nodes, tree_tokens=kv.tree.total_size,
                  evicted_tokens=kv.num_evicted,
                  locks_after=sum(e.cache_manager.tree.protected_size for e in on_engines))
    result.update(bookkeeping_bench())
    return result


def bookkeeping_bench(prefix_len: int = 2083, new_len: int = 35, requests: int = 300, seed: int = 0) -> dict:
    """Time the tree's work for one request of the Pico-vLLM write-up's shape in random token ids (a cached
    2083-token prefix + 35 new tokens, the `long` (GPU) workload's; our `long` shares 2,082 tokens):
    match_prefix, inc_lock_ref, insert (after the forward), dec_lock_ref. No model, no slots allocator."""
    rng = random.Random(seed)
    shared = [rng.randrange(49152) for _ in range(prefix_len)]
    tree = RadixTree()
    tree.insert(shared, list(range(prefix_len)))
    next_slot = prefix_len
    parts: dict[str, list[float]] = {"match": [], "lock": [], "insert": [], "unlock": []}
    totals = []
    clock = time.perf_counter
    for _ in range(requests):
        tokens = shared + [rng.randrange(49152) for _ in range(new_len)]
        t0 = clock()
        slots, node = tree.match_prefix(tokens[:-1])
        t1 = clock()
        tree.inc_lock_ref(node)
        t2 = clock()
        own = slots + list(range(next_slot, next_slot + len(tokens) - len(slots)))  # the forward's new slots
        next_slot += len(tokens) - len(slots)
        t3 = clock()
        tree.insert(tokens, own)
        t4 = clock()
        tree.dec_lock_ref(node)
        t5 = clock()
        for key, dt in zip(parts, (t1 - t0, t2 - t1, t4 - t3, t5 - t4)):
            parts[key].append(dt * 1e6)
        totals.append((t1 - t0) + (t2 - t1) + (t4 - t3) + (t5 - t4))
    tree.check_invariants()
    us = median(totals) * 1e6
    return {"bookkeeping_tokens": prefix_len + new_len, "bookkeeping_us_median": round(us, 1),
            "bookkeeping_us_p90": round(sorted(totals)[int(0.9 * len(totals))] * 1e6, 1),
            **{f"bookkeeping_{k}_us": round(median(v), 1) for k, v in parts.items()},
            "bookkeeping_budget_us": BOOKKEEPING_BUDGET_US, "bookkeeping_within_budget": us <= BOOKKEEPING_BUDGET_US}
