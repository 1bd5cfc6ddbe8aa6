"""`python -m course bench step05 --workload <name> [--json]`: the engine with the bridge (block_size 16), cache
off and on (through benchmarks.runner.prefix_cache_bench, as every prefix-caching chapter), plus per-round hit rates;
`--workload multi_turn` compares the host tier off and on instead (tier.py).

`python -m benchmarks.step05.bench [--workloads ...] [--block-sizes 16 4 1]` compares the three designs of chapters
3-5 without the model's cost getting in the way: on the same sequential requests it prints the prompt tokens
each design reuses (chapter 3's block hash and the bridge at several block sizes, chapter 4's slot tree) and
the cache manager's bookkeeping per request (admit, publish or insert, free), in microseconds.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from statistics import median

from benchmarks.runner import prefix_cache_bench, register
from course import results
from course.workloads import get_workload
from step01_kvcache.request import SamplingParams
from step02_paged import Engine, EngineConfig, KVCacheManager
from step02_paged.geometry import cdiv
from step02_paged.scheduler import admit
from step05_bridge.bridge_cache import BridgeKVCacheManager

BLOCK_SIZE = 16


def pool_blocks(prompts: list[list[int]], new_tokens: int, block_size: int) -> int:
    """Room for one round at once with the cache off (the concurrent pass): memory is measured, not preemption."""
    return sum(cdiv(len(p) + new_tokens, block_size) for p in prompts) + 8


@register("step05")
def bench_step05(args: argparse.Namespace) -> dict:
    from step01_kvcache.pretrained import load_tokenizer

    args.workload = args.workload or "short"
    if args.workload == "multi_turn":  # the host tier's bench: tier off vs on, not cache off vs on
        from .tier import tier_bench
        return tier_bench(args)
    from benchmarks.step04 import policies
    if args.workload == policies.WORKLOAD:  # chapter 4's scheduling policies, on the bridge
        return policies.compare_policies("step05", {"bridge": (BridgeKVCacheManager, BLOCK_SIZE)}, args)
    args.max_new_tokens = args.max_new_tokens or 8
    workload = get_workload(args.workload)
    prompts = workload.prompts(load_tokenizer(args.model))
    blocks = pool_blocks(prompts, args.max_new_tokens, BLOCK_SIZE)
    on_engines: list[Engine] = []

    def make_engine(model, on: bool) -> Engine:
        engine = Engine(model, EngineConfig(num_blocks=blocks, block_size=BLOCK_SIZE),
                        BridgeKVCacheManager if on else KVCacheManager)
        if on:
            on_engines.append(engine)
        return engine

    result = prefix_cache_bench("step05", make_engine, args)
    sequential = on_engines[0]  # the sequential pass over every round
    sequential.check_invariants()
    kv = sequential.cache_manager
    result.update(block_size=BLOCK_SIZE, pool_blocks=blocks, tree_nodes=kv.tree.num_nodes,
                  tree_tokens=kv.tree.num_tokens, cached_blocks=kv.num_cached_blocks, evicted_blocks=kv.num_evicted,
                  locks_after=sum(e.cache_manager.tree.protected_size for e in on_engines),
                  blocks_leaked=sum(e.cache_manager.block_manager.num_free + e.cache_manager.num_cached_blocks
                                    != e.config.num_blocks for e in on_engines))
    return result


# ---- the three designs side by side, without the model -------------------------------------------------------
def designs(block_sizes: list[int]) -> dict[str, Callable]:
    """name -> engine factory(model, num_blocks at block_size 1): chapter 3's hash and the bridge at each block
    size, and chapter 4's slot tree. Pools hold the same number of tokens."""
    from step03_prefix_hash import PrefixCachingKVCacheManager
    from step04_radix import RadixKVCacheManager

    def engine(manager, bs: int) -> Callable:
        return lambda m, slots: Engine(m, EngineConfig(num_blocks=cdiv(slots, bs), block_size=bs), manager)

    out: dict[str, Callable] = {}
    for bs in block_sizes:
        out[f"hash bs={bs}"] = engine(PrefixCachingKVCacheManager, bs)
        out[f"bridge bs={bs}"] = engine(BridgeKVCacheManager, bs)
    out["radix (ch. 4)"] = engine(RadixKVCacheManager, 1)
    return out


def bookkeeping_us(engine, prompts: list[list[int]], repeats: int) -> float:
    """Median microseconds of the cache manager's work for one request, no forward: admission (lookup and
    allocation), publishing or inserting the computed prompt, and the release when it finishes."""
    kv, times = engine.cache_manager, []
    for r in range(repeats):
        for i, p in enumerate(prompts):
            seq = kv.new_sequence(10_000 + r * len(prompts) + i, p, SamplingParams(max_new_tokens=1))
            t0 = time.perf_counter()
            match = kv.get_computed_blocks(seq)
            assert kv.allocate_slots(seq, seq.num_tokens - match.num_tokens, match)
            admit(kv, seq, match)
            seq.advance(seq.num_tokens - match.num_tokens)
            kv.on_computed(seq)
            kv.free(seq)
            times.append(time.perf_counter() - t0)
    kv.check_invariants()
    return median(times) * 1e6


def compare(workloads: list[str], block_sizes: list[int], repeats: int = 5) -> list[dict]:
    """Every design on every workload: prompt tokens reused on a sequential pass (every round, one new token
    each: hits depend on the prompts only), and the bookkeeping per request on a warm cache."""
    from step01_kvcache.pretrained import load_tokenizer
    from step01_kvcache.tiny import tiny_model

    tok = load_tokenizer()
    # the model's size does not change a hit; a 1-layer one keeps this bench about bookkeeping
    model = tiny_model(seed=0, vocab_size=49152, max_position_embeddings=8192, num_layers=1, hidden_size=32,
                       intermediate_size=32, head_dim=8)
    rows = []
    for name in workloads:
        w = get_workload(name)
        prompts = w.prompts(tok)
        every_round = prompts * w.rounds
        slots = sum(len(p) + 16 for p in every_round) + 256  # nothing is evicted: reuse is what is compared
        row: dict = {"workload": name, "prompt_tokens": sum(map(len, every_round))}
        for design, make in designs(block_sizes).items():
            engine = make(model, slots)
            outs = [engine.generate([p], SamplingParams(max_new_tokens=1))[0] for p in every_round]
            row[design] = {"cached_tokens": sum(o.num_cached_tokens for o in outs),
                           "bookkeeping_us": round(bookkeeping_us(engine, prompts, repeats), 1)}
            engine.check_invariants()
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step05.bench", description=__doc__)
    p.add_argument("--workloads", nargs="+", default=["short", "long", "shared_prefix", "diverge"])
    p.add_argument("--block-sizes", nargs="+", type=int, default=[16, 4, 1])
    p.add_argument("--repeats", type=int, default=5, help="warm passes timed for the bookkeeping median")
    p.add_argument("--save", action="store_true",
                   help="also write results/designs.json (read by `python -m course report`)")
    args = p.parse_args(argv)
    if any(bs <= 0 for bs in args.block_sizes):
        p.error("block sizes must be positive")
    import torch

    torch.set_grad_enabled(False)
    meta = results.started("python -m benchmarks.step05.bench " + " ".join(argv if argv is not None else sys.argv[1:]))
    rows = compare(args.workloads, args.block_sizes, args.repeats)
    names = [k for k in rows[0] if k not in ("workload", "prompt_tokens")]
    print(f"{'workload':<9} {'design':<14} {'cached tokens':>14} {'hit rate':>9} {'bookkeeping µs':>15}")
    for row in rows:
        for n in names:
            c, us = row[n]["cached_tokens"], row[n]["bookkeeping_us"]
            print(f"{row['workload']:<9} {n:<14} {c:>14} {c / row['prompt_tokens']:>9.3f} {us:>15}")
    print(json.dumps({"designs": rows}))
    if args.save:
        saved = results.save("step05", "designs", {"workload": "designs", "block_sizes": args.block_sizes,
                                                    "designs": rows}, meta)
        print(f"wrote {saved}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
