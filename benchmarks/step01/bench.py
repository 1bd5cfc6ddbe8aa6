"""`python -m course bench step01`: decode at batch 1 with the cache, without it, and Hugging Face `generate`;
then the cost of one decode step against the context length, for all three. Registers with `benchmarks.runner`."""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.runner import interleaved_best, progress, register
from course.chat import chat_ids
from step01_kvcache.cost import step_costs
from step01_kvcache.demo import DEFAULT_PROMPT, DEFAULT_SYSTEM
from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.hf import to_hf_model
from step01_kvcache.pretrained import load_model, load_tokenizer


@register("step01")
def bench_step01(args: argparse.Namespace) -> dict:
    """Decode speed at batch 1: our generate with the cache, without it, and Hugging Face generate (SDPA, its
    default attention); then the cost of one decode step against the context length, all three again."""
    model, tok = load_model(args.model), load_tokenizer(args.model)
    ids = chat_ids(tok, DEFAULT_PROMPT, DEFAULT_SYSTEM)
    n = args.max_new_tokens or 32
    params = SamplingParams(max_new_tokens=n)
    hf = to_hf_model(model, "sdpa")
    hf_kwargs = dict(attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=n, min_new_tokens=n,
                     do_sample=False, eos_token_id=None, pad_token_id=tok.eos_token_id)
    runs = {"on": lambda: generate(model, ids, params, use_cache=True),
            "off": lambda: generate(model, ids, params, use_cache=False),
            "hf": lambda: hf.generate(torch.tensor([ids]), **hf_kwargs)[0, len(ids):].tolist()}
    with torch.inference_mode():
        best, outs = interleaved_best(runs, repeats=args.repeats)
        contexts = args.contexts or [16, 64, 256, 512, 1024]
        costs = step_costs(model, contexts, repeats=args.repeats)
        hf_costs = hf_decode_step_s(hf, contexts, repeats=args.repeats)
    ours, ours_off, theirs = outs["on"], outs["off"], outs["hf"]
    t_on, t_off, t_hf = best["on"], best["off"], best["hf"]
    return dict(chapter="step01", workload="single", requests=1, prompt_tokens=len(ids), new_tokens=n,
                tokens_per_s_cache_on=round(n / t_on, 2), tokens_per_s_cache_off=round(n / t_off, 2),
                hf_tokens_per_s=round(n / t_hf, 2), speedup_cache=round(t_off / t_on, 2),
                speedup_vs_hf=round(t_hf / t_on, 3), hf_attention="sdpa",
                outputs_identical=ours == ours_off == theirs,
                decode_step_ms=[dict(context=c.context_len, cache_on=round(c.cached_s * 1e3, 2),
                                     cache_off=round(c.uncached_s * 1e3, 2), hf_cache_on=round(h * 1e3, 2))
                                for c, h in zip(costs, hf_costs)])


def hf_decode_step_s(hf, contexts: list[int], repeats: int = 3, seed: int = 0) -> list[float]:
    """Best wall time of one Hugging Face decode step over each context of cached tokens (random ids),
    repeats going round the contexts in turn as chapter 1's `step_costs` does. The cache is cropped back
    after each step, so every repeat sees the same context."""
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    setups = []
    for context in contexts:
        ids = torch.randint(0, hf.config.vocab_size, (1, context + 1), generator=gen)
        cache = DynamicCache(config=hf.config)
        hf(ids[:, :context], cache=cache, use_cache=True)
        setups.append((ids[:, context:], cache, context))
    best = [float("inf")] * len(contexts)
    for _ in progress(range(repeats), "HF decode steps"):
        for i, (last, cache, context) in enumerate(setups):
            t0 = time.perf_counter()
            hf(last, cache=cache, use_cache=True)
            best[i] = min(best[i], time.perf_counter() - t0)
            cache.crop(-1)  # drop the step's token: transformers 5 crops by a negative count
            assert cache.get_seq_length() == context
    return best
