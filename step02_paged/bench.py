"""`python -m course bench step02 --workload batch`: continuous batching vs one request at a time.

The same 8 ragged greedy requests (answers end at the end-of-turn token) through (a) our paged engine, all
at once, (b) Hugging Face `generate` one request at a time (batch 1: exact tokens, no padding), (c) step01's
contiguous-cache `generate`. Memory: the paged pool's waste against a contiguous cache that reserves
prompt + max_new_tokens per request, as it must when it cannot know the answer's length.
"""
from __future__ import annotations

import argparse

import torch

from course.bench import interleaved_best, register
from step01_kvcache.generate import SamplingParams, generate

from .config import EngineConfig
from .engine import Engine


def run_engine(model, cfg: EngineConfig, prompts: list[list[int]], params: SamplingParams) -> dict:
    """All prompts at once; also tracks what contiguous max-length buffers would hold at every step."""
    engine = Engine(model, cfg)
    ids = [engine.add_request(p, params) for p in prompts]
    done, reserved, filled = {}, 0, 0
    while engine.has_unfinished():
        for out in engine.step():
            done[out.seq_id] = out
        running = engine.scheduler.running
        reserved += sum(s.num_prompt_tokens + params.max_new_tokens for s in running)
        filled += sum(s.num_computed_tokens for s in running)
    return dict(outputs=[done[i].output_ids for i in ids], engine=engine,
                contiguous_waste=1 - filled / reserved if reserved else 0.0)


@register("step02")
def bench_step02(args: argparse.Namespace) -> dict:
    from course.demo import stop_ids
    from course.hf import to_hf_model
    from course.pretrained import load_model, load_tokenizer
    from course.workloads import get_workload

    workload = get_workload(args.workload or "batch")
    model, tok = load_model(args.model), load_tokenizer(args.model)
    prompts = workload.prompts(tok)
    stops = stop_ids(tok)
    params = SamplingParams(max_new_tokens=args.max_new_tokens or 64, stop_token_ids=stops)
    cfg = EngineConfig(num_blocks=256, block_size=16, max_num_seqs=len(prompts), max_num_batched_tokens=512)
    hf = to_hf_model(model)

    def hf_one_by_one():
        outs = []
        for p in prompts:
            out = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=params.max_new_tokens, do_sample=False, eos_token_id=list(stops),
                              pad_token_id=tok.eos_token_id)
            outs.append(out[0, len(p):].tolist())
        return outs

    runs = {"engine": lambda: run_engine(model, cfg, prompts, params),
            "hf": hf_one_by_one,
            "step01": lambda: [generate(model, p, params) for p in prompts]}
    with torch.inference_mode():
        best, outs = interleaved_best(runs, repeats=args.repeats)
    ours = outs["engine"]
    engine = ours["engine"]
    total = sum(len(o) for o in ours["outputs"])
    s = engine.stats
    return dict(
        chapter="step02", workload=workload.name, requests=len(prompts), prompt_tokens=sum(map(len, prompts)),
        new_tokens=total, steps=s.steps, tokens_per_s=round(total / best["engine"], 2),
        hf_tokens_per_s=round(total / best["hf"], 2), step01_tokens_per_s=round(total / best["step01"], 2),
        speedup_vs_hf=round(best["hf"] / best["engine"], 2),
        speedup_vs_step01=round(best["step01"] / best["engine"], 2),
        outputs_identical=ours["outputs"] == outs["hf"] == outs["step01"],
        kv_peak_bytes=s.peak_blocks * engine.kv_bytes_per_block,
        kv_waste_fraction=round(s.waste_fraction, 4),
        contiguous_waste_fraction=round(ours["contiguous_waste"], 4),
    )
