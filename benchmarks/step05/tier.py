"""`python -m course bench step05 --workload multi_turn`: the host tier off and on, on conversations that come back.

Three conversations take turns; each turn is its conversation so far plus a question. The device pool holds one
conversation, so by the time a conversation returns its earlier turns were evicted: without the tier they are
computed again, with it they come back from host memory. Both runs are chapter 5's engine, one request at a
time (as the Pico-vLLM write-up measures time to first token); only the manager's `host_blocks` differs. The
rates that decide the trade-off — copying a token's K/V against computing it — are measured on the same machine.
"""
from __future__ import annotations

import argparse
import functools
import time
from statistics import mean

import torch

from benchmarks.runner import p99, progress, run_sequential
from step01_kvcache.request import SamplingParams
from step02_paged import Engine, EngineConfig
from step02_paged.geometry import cdiv
from step05_bridge.bridge_cache import BridgeKVCacheManager
from step05_bridge.host_pool import HostPool


def tier_bench(args: argparse.Namespace) -> dict:
    from course.workloads import get_workload
    from step01_kvcache.pretrained import load_model, load_tokenizer

    workload = get_workload("multi_turn")
    model, tok = load_model(args.model), load_tokenizer(args.model)
    prompts = workload.prompts(tok)
    params = SamplingParams(max_new_tokens=args.max_new_tokens or 8)
    block = EngineConfig.block_size
    device_blocks = cdiv(max(map(len, prompts)) + params.max_new_tokens, block) + 2  # one conversation
    host_blocks = sum(cdiv(len(p), block) for p in prompts)  # every conversation

    def engine(host: int) -> Engine:
        manager = functools.partial(BridgeKVCacheManager, host_blocks=host)
        return Engine(model, EngineConfig(num_blocks=device_blocks, block_size=block), manager)

    engine(0).generate([prompts[0]], SamplingParams(max_new_tokens=2))  # warm-up
    runs, engines = {}, {}
    for tier, host in (("off", 0), ("on", host_blocks)):
        engines[tier] = engine(host)
        runs[tier] = run_sequential(engines[tier], prompts, params, f"step05 multi_turn, host tier {tier}")
        engines[tier].check_invariants()
    turns = len(prompts) // 3  # the first turn of each conversation has nothing to find
    later = {tier: [o.ttft_s for o in outs[turns:]] for tier, outs in runs.items()}
    prompt_tokens = sum(map(len, prompts))
    cached = {tier: sum(o.num_cached_tokens for o in outs) for tier, outs in runs.items()}
    host = engines["on"].cache_manager.host
    result = dict(chapter="step05", workload="multi_turn", requests=len(prompts), prompt_tokens=prompt_tokens,
                  new_tokens=params.max_new_tokens, device_blocks=device_blocks, host_blocks=host_blocks,
                  cached_tokens=cached["on"], hit_rate=round(cached["on"] / prompt_tokens, 4),
                  hit_rate_tier_off=round(cached["off"] / prompt_tokens, 4),
                  prompt_tokens_computed_off=prompt_tokens - cached["off"],
                  prompt_tokens_computed_on=prompt_tokens - cached["on"],
                  ttft_off_s=round(mean(later["off"]), 5), ttft_on_s=round(mean(later["on"]), 5),
                  ttft_off_p99_s=round(p99(later["off"]), 5), ttft_on_p99_s=round(p99(later["on"]), 5),
                  speedup_warm=round(mean(later["off"]) / mean(later["on"]), 2),
                  blocks_saved=host.blocks_saved, blocks_loaded=host.blocks_loaded,
                  outputs_identical=[o.output_ids for o in runs["off"]] == [o.output_ids for o in runs["on"]])
    result.update(trade_off(engines["on"].pool, runs["off"][:turns], prompts[:turns]))
    result.update(ttft_fit(runs, prompts, turns))
    return result


def ttft_fit(runs: dict[str, list], prompts: list[list[int]], turns: int) -> dict:
    """Each later turn's prompt tokens computed and time to first token, both runs, and the line through them:
    TTFT = fixed + per_token · computed. A forward has a cost that does not shrink with its tokens (every weight
    read once, the engine's step), so halving the tokens computed does not halve the time."""
    points = [(len(p) - o.num_cached_tokens, o.ttft_s) for outs in runs.values()
              for p, o in zip(prompts[turns:], outs[turns:])]
    n, sx, sy = len(points), sum(x for x, _ in points), sum(y for _, y in points)
    sxx, sxy = sum(x * x for x, _ in points), sum(x * y for x, y in points)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return dict(later_turns={tier: [[len(p) - o.num_cached_tokens, round(o.ttft_s, 4)]
                                    for p, o in zip(prompts[turns:], outs[turns:])] for tier, outs in runs.items()},
                ttft_fixed_s=round((sy - slope * sx) / n, 4), ttft_ms_per_token=round(slope * 1e3, 3))


def trade_off(pool, cold: list, prompts: list[list[int]], blocks: int = 64) -> dict:
    """Tokens per second two ways on this machine: copying K/V blocks out to the host tier and back, and computing
    them (the cold prefills of the first turns, whose time to first token is all prefill)."""
    host = HostPool(pool, blocks)
    ids = list(range(min(blocks, pool.geometry.num_blocks)))
    host.save(ids, ids)  # warm-up
    t0 = time.perf_counter()
    for _ in progress(range(5), "host tier copies"):
        host.save(ids, ids)
        host.load(ids, ids)
    if pool.k.is_cuda:
        torch.cuda.synchronize()
    copy_s = (time.perf_counter() - t0) / 10
    block = pool.geometry.block_size
    return dict(copy_tokens_s=round(len(ids) * block / copy_s), copy_bytes_per_token=host.bytes_per_block // block,
                prefill_tokens_s=round(sum(map(len, prompts)) / sum(o.ttft_s for o in cold)))


# ---- on a GPU: the same trade-off where prefill is fast -------------------------------------------------------
# Chapter 6's measurements call these with its engine (`make`: chapter 6's `make_engine`, Triton kernels and CUDA
# graphs), so that the recomputation they compare against is the fast one; this chapter imports nothing of chapter 6.

def copy_rates_gpu(model, blocks: int = 256) -> dict:
    """Host<->device copy bandwidth of K/V blocks (pinned host memory): what a load from the host tier costs."""
    block = EngineConfig.block_size
    kv_token = model.config.kv_bytes_per_token(model.dtype.itemsize)
    host = torch.empty(blocks * block * kv_token // 2, dtype=model.dtype, pin_memory=True)
    dev = torch.empty(host.shape, dtype=model.dtype, device="cuda")
    rates = {}
    for name, (dst, src) in (("h2d_gb_s", (dev, host)), ("d2h_gb_s", (host, dev))):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        rates[name] = round(10 * host.nbytes / (time.perf_counter() - t0) / 1e9, 1)
    return dict(kv_bytes_per_token=kv_token, **rates)


def host_tier_gpu(model, make, conversations: int = 16, turns: int = 4, first: int = 1024, more: int = 64) -> dict:
    """Multi-turn conversations that come back after their blocks were evicted: each turn is its conversation so
    far + `more` new tokens, every conversation's turn t before any turn t+1, one request at a time. The device
    pool holds about four conversations; the host tier (pinned, copies on a side stream) holds them all. Time to
    first token and tokens computed, tier off and on; then the copy and prefill rates behind the crossover.
    `make(model, prefix_cache, **options)` builds the engine."""
    g = torch.Generator().manual_seed(7)
    ids = lambda n: torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist()  # noqa: E731
    history = [ids(first) for _ in range(conversations)]
    requests = []
    for _ in range(turns):
        for c in range(conversations):
            history[c] = history[c] + ids(more)
            requests.append(list(history[c]))
    block = EngineConfig.block_size
    longest = max(map(len, requests))
    device_blocks = 4 * cdiv(longest, block) + 8
    host_blocks = conversations * cdiv(longest, block) + 8
    params = SamplingParams(max_new_tokens=1)
    out: dict = dict(requests=len(requests), prompt_tokens=sum(map(len, requests)), device_blocks=device_blocks,
                     host_blocks=host_blocks)
    tokens = {}
    for tier in ("off", "on"):
        engine = make(model, "bridge", num_blocks=device_blocks, block_size=block, max_num_seqs=4,
                      max_num_batched_tokens=8192, host_blocks=host_blocks if tier == "on" else 0)
        engine.generate(requests[:2], params)  # warm-up
        engine.cache_manager.reset_cache()
        ttft, runs = [], []
        for r in requests:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            runs.append(engine.generate([r], params)[0])
            torch.cuda.synchronize()
            ttft.append(time.perf_counter() - t0)
        engine.check_invariants()
        cached = sum(o.num_cached_tokens for o in runs)
        later = ttft[conversations:]  # turns 2.. (turn 1 has nothing to find)
        kv = engine.cache_manager
        out[f"tier_{tier}"] = dict(ttft_mean_ms=round(mean(later) * 1e3, 3), ttft_p99_ms=round(p99(later) * 1e3, 3),
                                   prompt_tokens_computed=out["prompt_tokens"] - cached, cached_tokens=cached,
                                   blocks_saved=kv.host.blocks_saved if kv.host else 0,
                                   blocks_loaded=kv.host.blocks_loaded if kv.host else 0)
        tokens[tier] = [o.output_ids for o in runs]
    out["first_tokens_match"] = sum(a == b for a, b in zip(tokens["on"], tokens["off"]))
    out["ttft_speedup"] = round(out["tier_off"]["ttft_mean_ms"] / out["tier_on"]["ttft_mean_ms"], 2)
    out["rates"] = copy_rates_gpu(model)
    prompt = requests[0][:first]
    engine = make(model, "none", num_blocks=cdiv(first, block) + 8, block_size=block, max_num_batched_tokens=8192)
    engine.generate([prompt], params)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    engine.generate([prompt], params)
    torch.cuda.synchronize()
    rates = out["rates"]
    rates["prefill_tokens_s"] = round(first / (time.perf_counter() - t0))
    rates["load_tokens_s"] = round(rates["h2d_gb_s"] * 1e9 / rates["kv_bytes_per_token"])
    return out


def host_tier_identity_gpu(model, make, conversations: int = 4, turns: int = 3) -> dict:
    """Multi-turn requests one by one with the host tier off and on (a device pool for one conversation): the
    tokens of prefixes brought back from host memory give the answers of recomputed ones."""
    g = torch.Generator().manual_seed(11)
    history = [torch.randint(3, model.config.vocab_size, (300,), generator=g).tolist() for _ in range(conversations)]
    requests = []
    for _ in range(turns):
        for c in range(conversations):
            history[c] += torch.randint(3, model.config.vocab_size, (40,), generator=g).tolist()
            requests.append(list(history[c]))
    params = SamplingParams(max_new_tokens=16)
    outs = {}
    for host in (0, 256):
        engine = make(model, "bridge", num_blocks=32, block_size=EngineConfig.block_size, max_num_seqs=2,
                      host_blocks=host)
        outs[host] = [engine.generate([r], params)[0] for r in requests]
        engine.check_invariants()
        loaded = engine.cache_manager.host.blocks_loaded if host else 0
    same = sum(a.output_ids == b.output_ids for a, b in zip(outs[0], outs[256]))
    return dict(requests=len(requests), identical=same, all_identical=same == len(requests), blocks_loaded=loaded,
                cached_tokens_on=sum(o.num_cached_tokens for o in outs[256]))
