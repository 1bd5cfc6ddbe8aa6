"""`python -m course bench step05 --workload <name> [--json]`: the engine with the bridge (block_size 16), cache
off and on (through benchmarks.runner.prefix_cache_bench, as every prefix-caching chapter), plus per-round hit rates;
`--workload multi_turn` compares the host tier off and on instead (tier.py); `--workload speculative` decodes with and
without prompt-lookup guesses (speculative.py).

`python -m benchmarks.step05.bench [--workloads ...] [--block-sizes 16 4 1]` compares the designs of chapters 3-5
without the model's cost getting in the way: on the same sequential requests it prints the prompt tokens each
design reuses (chapter 3's block hash, the bridge and the mini-runtime textbook's offset tree at several block
sizes, chapter 4's slot tree), the blocks its cache holds afterwards, the tokens the offset tree holds but cannot
lend (its matches' offsets) and the cache manager's bookkeeping per request (admit, publish or insert, free), in
microseconds. `--engines` runs the hash, the bridge and the offset tree through the engine on the real model
instead (each with its cache off and on, through prefix_cache_bench): hit rate, prompt tokens computed, peak
blocks held and time to first token, on the same workloads.
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
from step05_bridge.offset_cache import OffsetKVCacheManager

BLOCK_SIZE = 16
ENGINE_WORKLOADS = ["short", "long", "diverge", "multi_turn"]


def pool_blocks(prompts: list[list[int]], new_tokens: int, block_size: int) -> int:
    """Room for one round at once with the cache off (the concurrent pass): memory is measured, not preemption."""
    return sum(cdiv(len(p) + new_tokens, block_size) for p in prompts) + 8


@register("step05")
def bench_step05(args: argparse.Namespace) -> dict:
    from step01_kvcache.pretrained import load_model, load_tokenizer

    args.workload = args.workload or "short"
    if args.workload == "speculative":  # speculative decoding against plain decoding, no prefix cache
        from benchmarks.runner import progress

        from .speculative import spec_bench
        return spec_bench(load_model(args.model), load_tokenizer(args.model), max_new_tokens=args.max_new_tokens or 128,
                          repeats=args.repeats, progress=progress)
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


# ---- the designs side by side, without the model -------------------------------------------------------------
def designs(block_sizes: list[int]) -> dict[str, Callable]:
    """name -> engine factory(model, num_blocks at block_size 1): chapter 3's hash, the bridge and the offset tree
    at each block size, and chapter 4's slot tree. Pools hold the same number of tokens."""
    from step03_prefix_hash import PrefixCachingKVCacheManager
    from step04_radix import RadixKVCacheManager

    def engine(manager, bs: int) -> Callable:
        return lambda m, slots: Engine(m, EngineConfig(num_blocks=cdiv(slots, bs), block_size=bs), manager)

    out: dict[str, Callable] = {}
    for bs in block_sizes:
        out[f"hash bs={bs}"] = engine(PrefixCachingKVCacheManager, bs)
        out[f"bridge bs={bs}"] = engine(BridgeKVCacheManager, bs)
        out[f"offset bs={bs}"] = engine(OffsetKVCacheManager, bs)
    out["radix (ch. 4)"] = engine(RadixKVCacheManager, 1)
    return out


def cached_blocks(kv) -> int:
    """Blocks holding cached K/V once every request has finished: a tree's (chapter 4's slots are blocks of one),
    or the hash's map."""
    tree = getattr(kv, "tree", None)
    return tree.total_size if tree is not None else kv.block_manager.num_cached


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
            kv, outs, offsets = engine.cache_manager, [], 0
            for i, p in enumerate(every_round):
                if isinstance(kv, OffsetKVCacheManager):  # the lookup the engine is about to make, for its offset
                    offsets += kv.get_computed_blocks(kv.new_sequence(-1 - i, p, SamplingParams())).offset
                outs.append(engine.generate([p], SamplingParams(max_new_tokens=1))[0])
            row[design] = {"cached_tokens": sum(o.num_cached_tokens for o in outs), "cached_blocks": cached_blocks(kv)}
            if isinstance(kv, OffsetKVCacheManager):
                row[design]["offset_tokens"] = offsets  # held by the tree, computed again: no whole block holds them
            row[design]["bookkeeping_us"] = round(bookkeeping_us(engine, prompts, repeats), 1)
            engine.check_invariants()
        rows.append(row)
    return rows


# ---- the hash, the bridge and the offset tree on the real model ------------------------------------------------
def engine_designs() -> dict[str, type[KVCacheManager]]:
    from step03_prefix_hash import PrefixCachingKVCacheManager

    return {"hash": PrefixCachingKVCacheManager, "bridge": BridgeKVCacheManager, "offset": OffsetKVCacheManager}


def compare_engines(workloads: list[str], max_new_tokens: int = 8) -> list[dict]:
    """Each design's engine (block size 16), cache off and on, through the runner every prefix-caching chapter
    uses, on each workload: hit rate and TTFT from the sequential pass, peak blocks held from the concurrent round."""
    from step01_kvcache.pretrained import load_tokenizer

    tok, rows = load_tokenizer(), []
    for name in workloads:
        blocks = pool_blocks(get_workload(name).prompts(tok), max_new_tokens, BLOCK_SIZE)
        row: dict = {"workload": name, "pool_blocks": blocks}
        for design, manager in engine_designs().items():
            on_engines: list[Engine] = []

            def make_engine(model, on: bool, manager=manager, on_engines=on_engines, blocks=blocks) -> Engine:
                engine = Engine(model, EngineConfig(num_blocks=blocks, block_size=BLOCK_SIZE),
                                manager if on else KVCacheManager)
                if on:
                    on_engines.append(engine)
                return engine

            args = argparse.Namespace(workload=name, model=None, max_new_tokens=max_new_tokens)
            r = prefix_cache_bench(design, make_engine, args)
            for engine in on_engines:
                engine.check_invariants()
            row["prompt_tokens"] = r["prompt_tokens"]
            row[design] = {k: r[k] for k in ("cached_tokens", "hit_rate", "ttft_on_s", "ttft_cold_on_s",
                                             "ttft_on_warm_median_s", "ttft_off_warm_median_s", "speedup_warm",
                                             "outputs_identical")}
            row[design].update(prompt_tokens_computed=r["prompt_tokens"] - r["cached_tokens"],
                               peak_blocks=on_engines[1].stats.peak_blocks)  # the concurrent round's engine
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step05.bench", description=__doc__)
    p.add_argument("--workloads", nargs="+", default=None,
                   help="default: short long shared_prefix diverge multi_turn (with --engines: "
                   + " ".join(ENGINE_WORKLOADS) + ")")
    p.add_argument("--block-sizes", nargs="+", type=int, default=[16, 4, 1])
    p.add_argument("--repeats", type=int, default=5, help="warm passes timed for the bookkeeping median")
    p.add_argument("--engines", action="store_true",
                   help="the hash, the bridge and the offset tree through the engine on the real model, block size 16")
    p.add_argument("--save", action="store_true", help="also write results/designs.json (with --engines: "
                   "results/designs_engine.json), read by `python -m course report`")
    args = p.parse_args(argv)
    if any(bs <= 0 for bs in args.block_sizes):
        p.error("block sizes must be positive")
    import torch

    torch.set_grad_enabled(False)
    meta = results.started("python -m benchmarks.step05.bench " + " ".join(argv if argv is not None else sys.argv[1:]))
    if args.engines:
        return engines_main(args, meta)
    rows = compare(args.workloads or ["short", "long", "shared_prefix", "diverge", "multi_turn"], args.block_sizes,
                   args.repeats)
    names = [k for k in rows[0] if k not in ("workload", "prompt_tokens")]
    print(f"{'workload':<13} {'design':<14} {'cached tokens':>14} {'hit rate':>9} {'blocks':>7} {'offsets':>8} "
          f"{'bookkeeping µs':>15}")
    for row in rows:
        for n in names:
            d, rate = row[n], row[n]["cached_tokens"] / row["prompt_tokens"]
            print(f"{row['workload']:<13} {n:<14} {d['cached_tokens']:>14} {rate:>9.3f} {d['cached_blocks']:>7} "
                  f"{d.get('offset_tokens', ''):>8} {d['bookkeeping_us']:>15}")
    print(json.dumps({"designs": rows}))
    if args.save:
        saved = results.save("step05", "designs", {"workload": "designs", "block_sizes": args.block_sizes,
                                                    "designs": rows}, meta)
        print(f"wrote {saved}", file=sys.stderr)
    return 0


def engines_main(args: argparse.Namespace, meta: dict) -> int:
    rows = compare_engines(args.workloads or ENGINE_WORKLOADS)
    print(f"{'workload':<11} {'design':<7} {'hit rate':>9} {'computed':>9} {'peak blocks':>12} {'warm TTFT s':>12} "
          f"{'same':>5}")
    for row in rows:
        for n in engine_designs():
            d = row[n]
            print(f"{row['workload']:<11} {n:<7} {d['hit_rate']:>9} {d['prompt_tokens_computed']:>9} "
                  f"{d['peak_blocks']:>12} {d['ttft_on_warm_median_s']:>12} {d['outputs_identical']!s:>5}")
    print(json.dumps({"designs": rows}))
    if args.save:
        saved = results.save("step05", "designs_engine", {"workload": "designs_engine", "block_size": BLOCK_SIZE,
                                                           "designs": rows}, meta)
        print(f"wrote {saved}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
