"""What the benches share: timing helpers, the cache off / on runner every prefix-caching chapter uses with its
Hugging Face baselines, and the registry `python -m course bench` runs (each chapter's `benchmarks/stepNN/bench.py`
registers its bench function with `register`)."""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

import torch

BENCHES: dict[str, Callable[[argparse.Namespace], dict]] = {}


def register(chapter: str):
    def wrap(fn):
        BENCHES[chapter] = fn
        return fn
    return wrap


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def interleaved_best(runs: dict[str, Callable], repeats: int = 3) -> tuple[dict[str, float], dict[str, object]]:
    """Best wall time of each contender over `repeats` rounds, contenders alternating within a round, so a
    burst of load on the machine hits all of them rather than whichever happened to run then. The first
    round doubles as warm-up."""
    best = {k: float("inf") for k in runs}
    outs: dict[str, object] = {}
    for _ in range(repeats):
        for name, fn in runs.items():
            outs[name], t = timed(fn)
            best[name] = min(best[name], t)
    return best, outs


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile (with fewer than 100 values: the largest)."""
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


def progress(items, desc: str):
    """A progress bar on stderr for the long parts of a bench (stdout keeps the JSON line clean)."""
    from tqdm import tqdm

    return tqdm(items, desc=desc, file=sys.stderr, leave=False, disable=not sys.stderr.isatty())


def run_sequential(engine, prompts: list[list[int]], params, desc: str = "requests") -> list:
    """One request at a time, as the Pico-vLLM write-up measures TTFT: each request alone in the engine."""
    return [engine.generate([p], params)[0] for p in progress(prompts, desc)]


def run_concurrent(engine, prompts: list[list[int]], params) -> int:
    """All requests of a round at once; returns the peak KV bytes held (requests and cache together)."""
    engine.generate(prompts, params)
    return engine.stats.peak_blocks * engine.kv_bytes_per_block


def prefix_cache_bench(chapter: str, make_engine: Callable, args: argparse.Namespace) -> dict:
    """The bench every prefix-caching chapter shares: the same engine with its cache off and on, and Hugging
    Face (SDPA) without a cache and with its prompt-cache recipe, on the same requests in the same process.

    `make_engine(model, prefix_caching: bool)` builds a fresh engine. TTFT and hit rate come from a
    sequential pass over every round of the workload; peak memory and waste from a concurrent pass over
    one round (sharing between live requests shows there). Greedy decoding, so outputs must be identical.
    """
    from statistics import mean, median

    from course.workloads import get_workload
    from step01_kvcache.pretrained import load_model, load_tokenizer
    from step01_kvcache.request import SamplingParams

    workload = get_workload(args.workload or "short")
    model, tok = load_model(args.model), load_tokenizer(args.model)
    prompts = workload.prompts(tok)
    params = SamplingParams(max_new_tokens=args.max_new_tokens or 8)
    every_round = prompts * workload.rounds
    make_engine(model, False).generate([prompts[0]], SamplingParams(max_new_tokens=2))  # warm-up
    results, engines = {}, {}
    for on in (False, True):
        engines[on] = make_engine(model, on)
        results[on] = run_sequential(engines[on], every_round, params, f"{chapter} {workload.name} cache "
                                     + ("on" if on else "off"))
    peak = {on: run_concurrent(make_engine(model, on), prompts, params) for on in (False, True)}
    off, on = results[False], results[True]
    prompt_tokens = sum(len(p) for p in every_round)
    cached = sum(o.num_cached_tokens for o in on)
    warm_off, warm_on = [o.ttft_s for o in off[1:]], [o.ttft_s for o in on[1:]]
    bounds = [len(p) / max(1, len(p) - o.num_cached_tokens) for p, o in zip(every_round[1:], on[1:])]
    result = dict(
        chapter=chapter, workload=workload.name, requests=len(every_round), prompt_tokens=prompt_tokens,
        cached_tokens=cached, hit_rate=round(cached / prompt_tokens, 4),
        ttft_off_s=round(mean(o.ttft_s for o in off), 5), ttft_on_s=round(mean(o.ttft_s for o in on), 5),
        ttft_cold_off_s=round(off[0].ttft_s, 5), ttft_cold_on_s=round(on[0].ttft_s, 5),
        ttft_off_warm_median_s=round(median(warm_off), 5), ttft_on_warm_median_s=round(median(warm_on), 5),
        speedup_warm=round(median(warm_off) / median(warm_on), 2),
        speedup_warm_best=round(max(a / b for a, b in zip(warm_off, warm_on)), 2),
        # a warm request cannot beat (its prompt tokens / the tokens it still computes): the write-up's 2083/35 ≈ 60x
        speedup_bound=round(median(bounds), 1),
        outputs_identical=[o.output_ids for o in off] == [o.output_ids for o in on],
        kv_peak_bytes_off=peak[False], kv_peak_bytes_on=peak[True],
        kv_waste_fraction=round(engines[True].stats.waste_fraction, 4),
        new_tokens=params.max_new_tokens,
    )
    # per round, from the stats every cache manager keeps: (seq_id, prompt tokens, hit tokens) in admission order
    recent = list(engines[True].cache_manager.stats.recent)
    rounds = [recent[r * len(prompts): (r + 1) * len(prompts)] for r in range(workload.rounds)]
    result.update(hit_rate_per_round=[round(sum(h for *_, h in r) / sum(n for _, n, _ in r), 4) for r in rounds],
                  request_hit_rate_per_round=[round(sum(h > 0 for *_, h in r) / len(r), 3) for r in rounds])
    hf = hf_prefix_baselines(model, every_round, [o.output_ids[0] for o in on])
    result.update(hf, warm_ttft_vs_hf_recipe=round(hf["hf_recipe_ttft_warm_median_s"] / median(warm_on), 2),
                  cold_ttft_vs_hf=round(hf["hf_ttft_cold_s"] / on[0].ttft_s, 2))
    return result


# ---- Hugging Face baselines for prefix caching --------------------------------------------------------------

def hf_prefix_baselines(model, prompts: list[list[int]], first_tokens: list[int], nocache_requests: int = 3) -> dict:
    """Hugging Face with its default attention (SDPA) on the requests our engine served, one at a time:

    - cold: the first prompt's time to first token, no cache (what our cache-on engine pays on a miss);
    - no cache, warm: the next `nocache_requests` prompts, each a full prefill (a few are enough);
    - its "re-use a prompt cache" recipe: prefill the prefix every prompt shares once into a DynamicCache,
      deep-copy it per request (the copy is part of the recipe, so it is timed), `generate(cache=copy)`.
      That is the best a user of `generate` can do without a prefix cache; it only knows the one prefix
      it was given, while our caches find any earlier prefix by themselves.

    Greedy first tokens are compared with ours (`hf_first_tokens_match`); they should all agree."""
    from statistics import median

    from course.workloads import shared_prefix_len
    from step01_kvcache.hf import to_hf_model

    hf = to_hf_model(model, "sdpa")
    shared = min(shared_prefix_len(prompts), min(map(len, prompts)) - 1)  # generate needs >= 1 new token
    t0 = time.perf_counter()
    cache = hf_prefill(hf, prompts[0][:shared]) if shared else None
    prefix_s = time.perf_counter() - t0
    cold, cold_first = hf_ttfts(hf, prompts[:1], None)
    plain, plain_first = hf_ttfts(hf, prompts[1: 1 + nocache_requests], None)
    recipe, recipe_first = hf_ttfts(hf, prompts[1:], cache)
    return dict(hf_attention="sdpa", hf_shared_prefix_tokens=shared, hf_prefix_prefill_s=round(prefix_s, 4),
                hf_ttft_cold_s=round(cold[0], 5), hf_nocache_ttft_warm_median_s=round(median(plain), 5),
                hf_recipe_ttft_warm_median_s=round(median(recipe), 5),
                hf_recipe_speedup_warm=round(median(plain) / median(recipe), 2),
                hf_first_tokens_match=cold_first + recipe_first == first_tokens
                and plain_first == first_tokens[1: 1 + nocache_requests])


def hf_prefill(hf, prefix: list[int]):
    """A DynamicCache holding `prefix` (transformers 5 calls the argument `cache`, older ones `past_key_values`)."""
    from transformers import DynamicCache

    with torch.no_grad():
        return hf(torch.tensor([prefix]), cache=DynamicCache(config=hf.config), use_cache=True).cache


def hf_ttfts(hf, prompts: list[list[int]], prefix_cache) -> tuple[list[float], list[int]]:
    """Time to the first token of each prompt through `hf.generate`, with a deep copy of `prefix_cache` or with
    no cache (None). Also returns the first tokens."""
    import copy

    ttfts, firsts = [], []
    for p in progress(prompts, "HF time to first token"):
        ids = torch.tensor([p])
        t0 = time.perf_counter()
        extra = {} if prefix_cache is None else {"cache": copy.deepcopy(prefix_cache)}
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False,
                              pad_token_id=hf.config.pad_token_id, **extra)
        ttfts.append(time.perf_counter() - t0)
        firsts.append(int(out[0, len(p)]))
    return ttfts, firsts
