"""`python -m course bench <chapter> --workload <name> [--json]`: a chapter's engine, cache off and on, in
one process, so the ratios are measured side by side. Each chapter registers its bench function here."""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

from .demo import DEFAULT_PROMPT, DEFAULT_SYSTEM, chat_ids

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


@register("step01")
def bench_step01(args: argparse.Namespace) -> dict:
    """Decode speed at batch 1: our generate with the cache, without it, and Hugging Face generate."""
    from step01_kvcache.generate import SamplingParams, generate

    from .hf import to_hf_model
    from .pretrained import load_model, load_tokenizer

    model, tok = load_model(args.model), load_tokenizer(args.model)
    ids = chat_ids(tok, DEFAULT_PROMPT, DEFAULT_SYSTEM)
    n = args.max_new_tokens or 32
    params = SamplingParams(max_new_tokens=n)
    hf = to_hf_model(model)
    hf_kwargs = dict(attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=n, min_new_tokens=n,
                     do_sample=False, eos_token_id=None, pad_token_id=tok.eos_token_id)
    runs = {"on": lambda: generate(model, ids, params, use_cache=True),
            "off": lambda: generate(model, ids, params, use_cache=False),
            "hf": lambda: hf.generate(torch.tensor([ids]), **hf_kwargs)[0, len(ids):].tolist()}
    with torch.inference_mode():
        best, outs = interleaved_best(runs, repeats=args.repeats)
    ours, ours_off, theirs = outs["on"], outs["off"], outs["hf"]
    t_on, t_off, t_hf = best["on"], best["off"], best["hf"]
    return dict(chapter="step01", workload="single", requests=1, prompt_tokens=len(ids), new_tokens=n,
                tokens_per_s_cache_on=round(n / t_on, 2), tokens_per_s_cache_off=round(n / t_off, 2),
                hf_tokens_per_s=round(n / t_hf, 2), speedup_cache=round(t_off / t_on, 2),
                speedup_vs_hf=round(t_hf / t_on, 3), outputs_identical=ours == ours_off == theirs)


def run_sequential(engine, prompts: list[list[int]], params) -> list:
    """One request at a time, as the Pico-vLLM write-up measures TTFT: each request alone in the engine."""
    return [engine.generate([p], params)[0] for p in prompts]


def run_concurrent(engine, prompts: list[list[int]], params) -> int:
    """All requests of a round at once; returns the peak KV bytes held (requests and cache together)."""
    engine.generate(prompts, params)
    return engine.stats.peak_blocks * engine.kv_bytes_per_block


def prefix_cache_bench(chapter: str, make_engine: Callable, args: argparse.Namespace) -> dict:
    """The bench every prefix-caching chapter shares: the same engine with its cache off and on.

    `make_engine(model, prefix_caching: bool)` builds a fresh engine. TTFT and hit rate come from a
    sequential pass over every round of the workload; peak memory and waste from a concurrent pass over
    one round (sharing between live requests shows there). Greedy decoding, so outputs must be identical.
    """
    from statistics import mean, median

    from step01_kvcache.generate import SamplingParams

    from .pretrained import load_model, load_tokenizer
    from .workloads import get_workload

    workload = get_workload(args.workload or "short")
    model, tok = load_model(args.model), load_tokenizer(args.model)
    prompts = workload.prompts(tok)
    params = SamplingParams(max_new_tokens=args.max_new_tokens or 8)
    every_round = prompts * workload.rounds
    make_engine(model, False).generate([prompts[0]], SamplingParams(max_new_tokens=2))  # warm-up
    results, engines = {}, {}
    for on in (False, True):
        engines[on] = make_engine(model, on)
        results[on] = run_sequential(engines[on], every_round, params)
    peak = {on: run_concurrent(make_engine(model, on), prompts, params) for on in (False, True)}
    off, on = results[False], results[True]
    prompt_tokens = sum(len(p) for p in every_round)
    cached = sum(o.num_cached_tokens for o in on)
    warm_off, warm_on = [o.ttft_s for o in off[1:]], [o.ttft_s for o in on[1:]]
    bounds = [len(p) / max(1, len(p) - o.num_cached_tokens) for p, o in zip(every_round[1:], on[1:])]
    return dict(
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


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m course bench", description=__doc__)
    p.add_argument("chapter", help=f"one of {', '.join(sorted(BENCHES))} (or the package name)")
    p.add_argument("--workload", default=None, help="short | long | shared_prefix | batch (chapter-dependent)")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.add_argument("--model", default=None, help="local checkpoint folder or .gguf (default SmolLM2-135M)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens generated per request (default: the chapter's; TTFT does not depend on it)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds for best-of timings (where used)")
    args = p.parse_args(argv)
    chapter = args.chapter.split("_")[0]
    if chapter not in BENCHES:
        _load_chapter_benches()
    if chapter not in BENCHES:
        print(f"no bench for {args.chapter!r}; choose from {', '.join(sorted(BENCHES))}", file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    try:
        result = BENCHES[chapter](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result))
        for k, v in result.items():
            print(f"{k:<{width}}  {v}")
    return 0


def _load_chapter_benches() -> None:
    """Later chapters keep their bench next to their engine (stepNN_x/bench.py) and register on import."""
    import importlib
    import pkgutil

    from .paths import REPO_ROOT

    for info in pkgutil.iter_modules([str(REPO_ROOT)]):
        if info.name.startswith("step0") and (REPO_ROOT / info.name / "bench.py").exists():
            importlib.import_module(f"{info.name}.bench")
