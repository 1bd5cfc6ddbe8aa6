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


@register("step01")
def bench_step01(args: argparse.Namespace) -> dict:
    """Decode speed at batch 1: our generate with the cache, without it, and Hugging Face generate."""
    from step01_kvcache.generate import SamplingParams, generate

    from .hf import to_hf_model
    from .pretrained import load_model, load_tokenizer

    model, tok = load_model(args.model), load_tokenizer(args.model)
    ids = chat_ids(tok, DEFAULT_PROMPT, DEFAULT_SYSTEM)
    n = args.max_new_tokens
    params = SamplingParams(max_new_tokens=n)
    generate(model, ids, SamplingParams(max_new_tokens=2))  # warm-up
    ours, t_on = timed(generate, model, ids, params, use_cache=True)
    ours_off, t_off = timed(generate, model, ids, params, use_cache=False)
    hf = to_hf_model(model)
    hf_kwargs = dict(attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=n, min_new_tokens=n,
                     do_sample=False, eos_token_id=None, pad_token_id=tok.eos_token_id)
    with torch.inference_mode():
        hf.generate(torch.tensor([ids]), **(hf_kwargs | dict(max_new_tokens=2, min_new_tokens=2)))  # warm-up
        out, t_hf = timed(hf.generate, torch.tensor([ids]), **hf_kwargs)
    theirs = out[0, len(ids):].tolist()
    return dict(chapter="step01", workload="single", requests=1, prompt_tokens=len(ids), new_tokens=n,
                tokens_per_s_cache_on=round(n / t_on, 2), tokens_per_s_cache_off=round(n / t_off, 2),
                hf_tokens_per_s=round(n / t_hf, 2), speedup_cache=round(t_off / t_on, 2),
                speedup_vs_hf=round(t_hf / t_on, 3), outputs_identical=ours == ours_off == theirs)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m course bench", description=__doc__)
    p.add_argument("chapter", help=f"one of {', '.join(sorted(BENCHES))} (or the package name)")
    p.add_argument("--workload", default=None, help="short | long | seed003 | batch (chapter-dependent)")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.add_argument("--model", default=None, help="local checkpoint folder or .gguf (default SmolLM2-135M)")
    p.add_argument("--max-new-tokens", type=int, default=32)
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
