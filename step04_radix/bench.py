"""`python -m course bench step04 --workload <name> [--json]`: the engine on one-token slots with the radix cache
off and on (through course.bench.prefix_cache_bench, as every prefix-caching chapter), plus the cost of the
tree's bookkeeping.

`python -m step04_radix.bench [--workloads short long shared_prefix diverge]` runs the same bench for this chapter
and, when chapter 3 is importable, for step03's hashed-block cache, and prints them side by side.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from statistics import median

from course.bench import BENCHES, prefix_cache_bench, register
from course.workloads import get_workload
from step02_paged import Engine, EngineConfig, KVCacheManager

from .radix_cache import RadixKVCacheManager
from .radix_tree import RadixTree

BOOKKEEPING_BUDGET_US = 100.0  # match + lock + insert + unlock of a 2k-token request


def pool_slots(workload: str, max_new_tokens: int) -> int:
    """Enough slots for one round of the workload at once with the cache off (no preemption skews memory)."""
    from course.pretrained import load_tokenizer

    prompts = get_workload(workload).prompts(load_tokenizer())
    return sum(len(p) + max_new_tokens for p in prompts) + 64


@register("step04")
def bench_step04(args: argparse.Namespace) -> dict:
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
    per_request = list(sequential.kv.admissions)  # (seq_id, prompt tokens, cached) in arrival order
    size = len(per_request) // get_workload(args.workload).rounds
    rounds = [per_request[i: i + size] for i in range(0, len(per_request), size)]
    result.update(hit_rate_per_round=[round(sum(c for *_, c in r) / sum(n for _, n, _ in r), 4) for r in rounds],
                  request_hit_rate_per_round=[round(sum(c > 0 for *_, c in r) / len(r), 3) for r in rounds])
    result.update(pool_slots=slots, tree_nodes=sequential.kv.tree.num_nodes, tree_tokens=sequential.kv.tree.total_size,
                  evicted_tokens=sequential.kv.num_evicted,
                  locks_after=sum(e.kv.tree.protected_size for e in on_engines))
    result.update(bookkeeping_bench())
    return result


def bookkeeping_bench(prefix_len: int = 2083, new_len: int = 35, requests: int = 300, seed: int = 0) -> dict:
    """Time the tree's work for one request of `long`'s shape (a cached 2083-token prefix + 35 new tokens):
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


# ---- side by side with chapter 3 ---------------------------------------------------------------------------
COLUMNS = ("hit_rate", "cached_tokens", "speedup_warm", "ttft_on_warm_median_s", "kv_peak_bytes_on",
           "kv_waste_fraction", "outputs_identical")


def step03_bench() -> tuple[Callable[[argparse.Namespace], dict] | None, str]:
    """Chapter 3's registered bench, or None and the reason when it cannot be imported (yet)."""
    try:
        import step03_prefix_hash.bench  # noqa: F401  (registers "step03")
    except ImportError as exc:
        return None, f"step03_prefix_hash is not importable ({exc}); radix only"
    if "step03" not in BENCHES:
        return None, "step03_prefix_hash.bench registers no 'step03' bench; radix only"
    return BENCHES["step03"], ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m step04_radix.bench", description=__doc__)
    p.add_argument("--workloads", nargs="+", default=["short", "long", "shared_prefix", "diverge"])
    p.add_argument("--model", default=None)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    import torch

    torch.set_grad_enabled(False)
    hash_bench, why = step03_bench()
    if why:
        print(why, file=sys.stderr)
    rows = []
    for name in args.workloads:
        ns = argparse.Namespace(workload=name, model=args.model, max_new_tokens=args.max_new_tokens,
                                repeats=args.repeats)
        radix = bench_step04(ns)
        hashed = hash_bench(argparse.Namespace(**vars(ns))) if hash_bench else {}
        rows.append({"workload": name, "step04": {k: radix.get(k) for k in COLUMNS},
                     "step03": {k: hashed.get(k) for k in COLUMNS} if hashed else None})
    print(f"{'workload':<9} {'metric':<24} {'step04 radix':>14} {'step03 hash':>14}")
    for row in rows:
        for k in COLUMNS:
            theirs = row["step03"][k] if row["step03"] else "-"
            print(f"{row['workload']:<9} {k:<24} {row['step04'][k]!s:>14} {theirs!s:>14}")
    print(json.dumps({"side_by_side": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
