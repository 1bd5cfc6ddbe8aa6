"""`python -m course bench step02 --workload batch`: continuous batching vs one request at a time
(`--workload host`: the engine's host work per decode step, without a model; see host.py).

The same 8 ragged greedy requests (answers end at the end-of-turn token) through (a) our paged engine, all
at once, (b) Hugging Face `generate` with its default attention (SDPA), all 8 in one left-padded batch, as a
user with 8 prompts would call it, (c) Hugging Face `generate` one request at a time (batch 1, no padding),
(d) step01's contiguous-cache `generate`. Every contender is credited with each request's own tokens only (a
padded batch keeps stepping finished rows; those steps earn nothing). Memory, step by step: the blocks the
paged pool holds against what contiguous per-request buffers reserve (prompt + max_new_tokens, as they must
when the answer's length is unknown) and what HF's padded batch holds (every row as long as the longest).
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.runner import interleaved_best, register
from step01_kvcache.generate import SamplingParams, generate
from step02_paged.config import EngineConfig
from step02_paged.engine import Engine


def run_engine(model, cfg: EngineConfig, prompts: list[list[int]], params: SamplingParams) -> dict:
    """All prompts at once; also records, per step, the KV tokens the pool holds and the tokens contiguous
    max-length buffers would reserve for the same running requests."""
    engine = Engine(model, cfg)
    ids = [engine.add_request(p, params) for p in prompts]
    done, paged, contiguous, filled = {}, [], [], 0
    while engine.has_unfinished():
        for out in engine.step():
            done[out.seq_id] = out
        running = engine.scheduler.running
        paged.append((cfg.num_blocks - engine.cache_manager.block_manager.num_free) * cfg.block_size)
        contiguous.append(sum(s.num_prompt_tokens + params.max_new_tokens for s in running))
        filled += sum(s.num_computed_tokens for s in running)
    return dict(outputs=[done[i].output_ids for i in ids], engine=engine, paged_tokens=paged,
                contiguous_tokens=contiguous, contiguous_waste=1 - filled / max(1, sum(contiguous)))


def own_tokens(row: list[int], stops: set[int]) -> list[int]:
    """A padded batch row's answer: up to and including its first stop token (the rest is padding)."""
    for i, t in enumerate(row):
        if t in stops:
            return row[: i + 1]
    return row


def hf_batched(hf, prompts: list[list[int]], params: SamplingParams, pad_id: int) -> dict:
    """All prompts in one left-padded `generate` call; returns each request's own tokens and the KV tokens the
    padded batch held at each decode step."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=params.max_new_tokens, do_sample=False,
                      eos_token_id=list(params.stop_token_ids), pad_token_id=pad_id)
    rows = [own_tokens(r, set(params.stop_token_ids)) for r in out[:, width:].tolist()]
    steps = out.shape[1] - width
    return dict(outputs=rows, held_tokens=[len(prompts) * (width + t) for t in range(1, steps + 1)])


@register("step02")
def bench_step02(args: argparse.Namespace) -> dict:
    if args.workload == "host":
        from benchmarks.runner import progress

        from .host import host_bench
        return host_bench(progress=progress)
    from course.workloads import get_workload
    from step01_kvcache.demo import stop_ids
    from step01_kvcache.hf import to_hf_model
    from step01_kvcache.pretrained import load_model, load_tokenizer

    workload = get_workload(args.workload or "batch")
    model, tok = load_model(args.model), load_tokenizer(args.model)
    prompts = workload.prompts(tok)
    stops = stop_ids(tok)
    params = SamplingParams(max_new_tokens=args.max_new_tokens or 64, stop_token_ids=stops)
    cfg = EngineConfig(num_blocks=256, block_size=16, max_num_seqs=len(prompts), max_num_batched_tokens=512)
    hf = to_hf_model(model, "sdpa")

    def hf_one_by_one():
        outs = []
        for p in prompts:
            out = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=params.max_new_tokens, do_sample=False, eos_token_id=list(stops),
                              pad_token_id=tok.eos_token_id)
            outs.append(out[0, len(p):].tolist())
        return outs

    runs = {"engine": lambda: run_engine(model, cfg, prompts, params),
            "hf_batched": lambda: hf_batched(hf, prompts, params, tok.eos_token_id),
            "hf": hf_one_by_one,
            "step01": lambda: [generate(model, p, params) for p in prompts]}
    with torch.inference_mode():
        best, outs = interleaved_best(runs, repeats=args.repeats)
    ours, batched = outs["engine"], outs["hf_batched"]
    engine = ours["engine"]
    total = sum(len(o) for o in ours["outputs"])
    s = engine.stats
    per_token = engine.kv_bytes_per_block // cfg.block_size
    mib = lambda tokens: round(tokens * per_token / 2**20, 2)  # noqa: E731
    return dict(
        chapter="step02", workload=workload.name, requests=len(prompts), prompt_tokens=sum(map(len, prompts)),
        new_tokens=total, steps=s.steps, hf_attention="sdpa", tokens_per_s=round(total / best["engine"], 2),
        hf_batched_tokens_per_s=round(total / best["hf_batched"], 2),
        hf_tokens_per_s=round(total / best["hf"], 2), step01_tokens_per_s=round(total / best["step01"], 2),
        speedup_vs_hf_batched=round(best["hf_batched"] / best["engine"], 2),
        speedup_vs_hf=round(best["hf"] / best["engine"], 2),
        speedup_vs_step01=round(best["step01"] / best["engine"], 2),
        outputs_identical=ours["outputs"] == outs["hf"] == outs["step01"],
        # padding changes the fp32 sums a little, so a near-tie can flip a greedy token: reported, not required
        hf_batched_outputs_identical=batched["outputs"] == ours["outputs"],
        kv_peak_bytes=s.peak_blocks * engine.kv_bytes_per_block,
        kv_waste_fraction=round(s.waste_fraction, 4),
        kv_mib_per_step=dict(paged=[mib(t) for t in ours["paged_tokens"]],
                             contiguous=[mib(t) for t in ours["contiguous_tokens"]],
                             hf_batched=[mib(t) for t in batched["held_tokens"]]),
        contiguous_waste_fraction=round(ours["contiguous_waste"], 4),
        paged_saving_vs_contiguous=round(1 - sum(ours["paged_tokens"]) / sum(ours["contiguous_tokens"]), 4),
    )
