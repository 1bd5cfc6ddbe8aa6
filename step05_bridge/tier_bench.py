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

from course.bench import p99, progress, run_sequential
from step01_kvcache.request import SamplingParams
from step02_paged import Engine, EngineConfig
from step02_paged.geometry import cdiv

from .bridge_cache import BridgeKVCacheManager
from .host_pool import HostPool


def tier_bench(args: argparse.Namespace) -> dict:
    from course.pretrained import load_model, load_tokenizer
    from course.workloads import get_workload

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
    return result


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
