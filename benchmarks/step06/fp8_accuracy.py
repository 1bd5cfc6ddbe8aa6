"""`python -m course bench step06 --workload fp8`: what an FP8 KV cache does to the real model's answers, on a CPU.

SmolLM2-135M-Instruct in fp32, through the course's engine (chapter 5's bridge over chapter 2's torch attention),
with its pool in fp32 (the reference) and in fp8 e4m3 (`kv_cache_dtype="fp8_e4m3"`) under four scale
granularities (step06_triton/fp8_pool.py):
- dynamic, one scale per token and head, computed as each row is stored (the course's pool);
- static, one per layer (vLLM's and SGLang's k_scale / v_scale), calibrated;
- static, one per layer and head, calibrated;
- static, one per layer, 1.0: what vLLM uses when a checkpoint brings no scales.
Calibration: the largest |K| and |V| of every layer and head over the `batch` workload's 8 prompts, through the fp32
model, mapped to 448 (`calibrate`); the scales are in the JSON.

For each pool: greedy answers to every workload's requests (one round each; up to 64 new tokens, stopping at the end
of turn) against the fp32 pool's, request by request: identical or not, and the first generated token that differs;
the KL divergence KL(fp32 || fp8) of the next-token distributions along the fp32 answers (teacher forcing: the same
tokens in both, only the cache differs) and how often their argmax agree; perplexity of the `long` workload's
reference manual read as plain text (2,074 tokens; not part of the calibration), with the text's own largest |K| and
|V| per layer (beyond the calibration's, a static scale saturates). Plus the capacity arithmetic of
each pool: bytes per 16-token block, blocks and tokens per GiB, for SmolLM2 and a Llama-3-8B layout.
Deterministic: the figures do not depend on the machine's load (only `elapsed_s` does).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from benchmarks.runner import progress
from step01_kvcache.config import ModelConfig
from step01_kvcache.model import Transformer
from step01_kvcache.request import SamplingParams
from step02_paged.forward_batch import ForwardBatch
from step02_paged.geometry import PoolGeometry, cdiv
from step02_paged.kv_pool import KVPool
from step02_paged.paged_attention import PagedAttention
from step06_triton.fp8_pool import KVScales, calibrate, make_kv_pool

WORKLOADS = ("short", "long", "shared_prefix", "batch", "diverge", "multi_turn", "multi_doc")
CALIBRATION = "batch"
BLOCK, CHUNK, NEW_TOKENS = 16, 512, 64
REFERENCE = "fp32"
VARIANTS = {  # name -> how its scales are chosen; the first fp8 one is the course's
    "fp8, per token and head (dynamic)": "token",
    "fp8, per layer (calibrated)": "tensor",
    "fp8, per layer and head (calibrated)": "head",
    "fp8, per layer, 1.0 (uncalibrated)": "one",
}
LLAMA_3_8B = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                         num_kv_heads=8, head_dim=128)


def pool_options(granularity: str, calibrated: KVScales, num_layers: int) -> dict:
    """`EngineConfig` / `make_kv_pool` options of a pool: kv_cache_dtype and kv_scales."""
    if granularity == REFERENCE:
        return dict(kv_cache_dtype="auto")
    scales = {"token": None, "tensor": calibrated.per_layer(), "head": calibrated,
              "one": KVScales.uniform(num_layers)}[granularity]
    return dict(kv_cache_dtype="fp8_e4m3", kv_scales=scales)


def capacity(cfg: ModelConfig, options: dict, dtype: torch.dtype) -> dict:
    """Bytes of one 16-token block of `cfg` in a pool with `options` (computing in `dtype`), and what a GiB holds."""
    pool = make_kv_pool(cfg, PoolGeometry(1, BLOCK), dtype=dtype, device="meta", **options)
    per_block = pool.bytes_per_block
    return dict(bytes_per_block=per_block, blocks_per_gib=2**30 // per_block,
                tokens_per_gib=2**30 // per_block * BLOCK)


def capacity_table(model: Transformer) -> dict:
    """SmolLM2 (fp32 on a CPU, bf16 on a GPU) and a Llama-3-8B layout: bytes per block and per GiB of each pool. The
    static granularities cost the same bytes (their scales are a few numbers per layer, not per block)."""
    out = {}
    for name, cfg in (("smollm2_135m", model.config), ("llama_3_8b", LLAMA_3_8B)):
        static = dict(kv_cache_dtype="fp8_e4m3", kv_scales=KVScales.uniform(cfg.num_layers))
        out[name] = dict(layers=cfg.num_layers, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, pools={
            "fp32": capacity(cfg, dict(kv_cache_dtype="auto"), torch.float32),
            "bf16": capacity(cfg, dict(kv_cache_dtype="auto"), torch.bfloat16),
            "fp8, scales per token and head": capacity(cfg, dict(kv_cache_dtype="fp8_e4m3"), torch.bfloat16),
            "fp8, static scales": capacity(cfg, static, torch.bfloat16)})
    return out


# ---- greedy answers through the engine ---------------------------------------------------------------------------
def greedy_answers(model: Transformer, prompts: list[list[int]], params: SamplingParams, options: dict) -> list:
    """All prompts at once through chapter 5's engine (its prefix cache shares what the prompts share)."""
    from step06_triton.engine import make_engine

    blocks = sum(cdiv(len(p) + params.max_new_tokens, BLOCK) for p in prompts) + 8
    engine = make_engine(model, "bridge", "torch", num_blocks=blocks, block_size=BLOCK, max_num_seqs=len(prompts),
                         max_num_batched_tokens=2048, **options)
    outs = engine.generate(prompts, params)
    engine.check_invariants()
    return [o.output_ids for o in outs]


def first_divergence(ours: list[int], reference: list[int]) -> int | None:
    """Index of the first generated token that differs (None: identical answers; a shorter answer differs where
    it stopped)."""
    if ours == reference:
        return None
    return next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), min(len(ours), len(reference)))


# ---- teacher forcing: next-token distributions along fixed tokens --------------------------------------------------
def forced_logits(model: Transformer, pools: dict[str, KVPool], seqs: list[list[int]], starts: list[int]
                  ) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """For every pool, the logits that predict tokens starts[i] .. len(seqs[i]) - 1 of each sequence, read through
    the pool as the engine reads it (chapter 2's PagedAttention, chunks of CHUNK tokens). The prefix all sequences
    share (whole blocks) is computed once per pool and its blocks are shared by every sequence's block table, as a
    prefix cache would share them. Yields (i, {pool name: logits [len - start, vocab]})."""
    from course.workloads import shared_prefix_len

    shared = min(shared_prefix_len(seqs), min(starts) - 1) // BLOCK * BLOCK
    prefix = list(range(shared // BLOCK))

    def run(pool: KVPool, ids: list[int], table: list[int], begin: int, want_from: int) -> torch.Tensor | None:
        rows = []
        for s in range(begin, len(ids), CHUNK):
            e = min(len(ids), s + CHUNK)
            batch = ForwardBatch.from_block_tables([table], [s], [e - s], BLOCK)
            hidden = model(torch.tensor(ids[s:e]), batch.positions, PagedAttention.for_step(pool, batch))
            keep = hidden[max(0, want_from - s):]
            if e > want_from and keep.shape[0]:
                rows.append(model.compute_logits(keep))
        return torch.cat(rows) if rows else None

    for pool in pools.values():
        run(pool, seqs[0][:shared], prefix, 0, shared)  # the shared prefix's K/V, once
    for i, (ids, start) in enumerate(zip(seqs, starts)):
        table = prefix + list(range(len(prefix), len(prefix) + cdiv(len(ids), BLOCK) - len(prefix)))
        yield i, {name: run(pool, ids[:-1], table, shared, start - 1) for name, pool in pools.items()}


def kl_and_agreement(reference: torch.Tensor, other: torch.Tensor) -> tuple[list[float], list[bool]]:
    """Per row: KL(reference || other) of the next-token distributions, and whether their argmax agree."""
    ref, oth = F.log_softmax(reference.float(), -1), F.log_softmax(other.float(), -1)
    kl = (ref.exp() * (ref - oth)).sum(-1).clamp(min=0)
    return kl.tolist(), (reference.argmax(-1) == other.argmax(-1)).tolist()


def make_pools(model: Transformer, names: dict[str, dict], tokens: int) -> dict[str, KVPool]:
    geometry = PoolGeometry(cdiv(tokens, BLOCK) + 1, BLOCK)
    return {name: make_kv_pool(model.config, geometry, dtype=model.dtype, device=model.device, **opts)
            for name, opts in names.items()}


@torch.inference_mode()
def fp8_accuracy(model: Transformer, tokenizer, max_new_tokens: int = NEW_TOKENS) -> dict:
    from course.chat import stop_ids
    from course.workloads import TEXTS, get_workload

    t0 = time.perf_counter()
    calibrated = calibrate(model, get_workload(CALIBRATION).prompts(tokenizer))
    names = {REFERENCE: pool_options(REFERENCE, calibrated, model.config.num_layers)}
    names.update({v: pool_options(g, calibrated, model.config.num_layers) for v, g in VARIANTS.items()})
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop_ids(tokenizer))
    per_workload: dict[str, dict] = {}
    kl: dict[str, list[float]] = {v: [] for v in VARIANTS}
    top1: dict[str, list[bool]] = {v: [] for v in VARIANTS}
    for wl in progress(WORKLOADS, "fp8 accuracy, workloads"):
        prompts = get_workload(wl).prompts(tokenizer)
        answers = {name: greedy_answers(model, prompts, params, opts) for name, opts in names.items()}
        ref = answers[REFERENCE]
        row: dict = dict(requests=len(prompts), prompt_tokens=sum(map(len, prompts)),
                         reference_new_tokens=sum(map(len, ref)))
        for v in VARIANTS:
            div = [first_divergence(a, r) for a, r in zip(answers[v], ref)]
            row[v] = dict(identical=sum(d is None for d in div), first_divergence=div)
        seqs = [p + r for p, r in zip(prompts, ref)]
        pools = make_pools(model, names, max(map(len, seqs)))
        wl_kl: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _, logits in forced_logits(model, pools, seqs, [len(p) for p in prompts]):
            for v in VARIANTS:
                k, a = kl_and_agreement(logits[REFERENCE], logits[v])
                wl_kl[v] += k
                kl[v] += k
                top1[v] += a
        for v in VARIANTS:
            row[v]["kl_mean"] = round(sum(wl_kl[v]) / len(wl_kl[v]), 6)
        per_workload[wl] = row
    text = (TEXTS / "long_reference.txt").read_text(encoding="utf-8").strip()
    ids = tokenizer.encode(text)
    text_range = calibrate(model, [ids])  # the text's own largest |K|, |V|: where a static scale saturates
    pools = make_pools(model, names, len(ids))
    _, logits = next(forced_logits(model, pools, [ids], [1]))
    target = torch.tensor(ids[1:])
    ppl = {name: round(math.exp(F.cross_entropy(lg.float(), target).item()), 4) for name, lg in logits.items()}
    ppl_kl = {v: kl_and_agreement(logits[REFERENCE], logits[v]) for v in VARIANTS}
    summary = {}
    for v in VARIANTS:
        divs = [d for wl in per_workload.values() for d in wl[v]["first_divergence"]]
        diverged = sorted(d for d in divs if d is not None)
        summary[v] = dict(
            granularity=VARIANTS[v], requests=len(divs), identical=len(divs) - len(diverged),
            identical_fraction=round((len(divs) - len(diverged)) / len(divs), 4),
            first_divergence_median=diverged[len(diverged) // 2] if diverged else None,
            first_divergence_min=diverged[0] if diverged else None,
            kl_mean=round(sum(kl[v]) / len(kl[v]), 6), kl_max=round(max(kl[v]), 4),
            top1_agreement=round(sum(top1[v]) / len(top1[v]), 4),
            perplexity=ppl[v], perplexity_change=round(ppl[v] / ppl[REFERENCE] - 1, 5),
            perplexity_text_kl_mean=round(sum(ppl_kl[v][0]) / len(ppl_kl[v][0]), 6),
        )
    return dict(
        chapter="step06", workload="fp8", model="SmolLM2-135M-Instruct", dtype="fp32", new_tokens=max_new_tokens,
        block_size=BLOCK, workloads=list(WORKLOADS), requests=sum(r["requests"] for r in per_workload.values()),
        calibration=dict(workload=CALIBRATION, k_amax_per_layer=[round(max(r) * 448, 3) for r in calibrated.k],
                         v_amax_per_layer=[round(max(r) * 448, 3) for r in calibrated.v], scales_per_head=dict(
                             k=[list(r) for r in calibrated.k], v=[list(r) for r in calibrated.v])),
        perplexity_text=dict(name="long_reference.txt", tokens=len(ids), fp32=ppl[REFERENCE],
                             k_amax_per_layer=[round(max(r) * 448, 3) for r in text_range.k],
                             v_amax_per_layer=[round(max(r) * 448, 3) for r in text_range.v]),
        target_perplexity_change=0.01, variants=summary, per_workload=per_workload,
        positions_scored=len(kl[next(iter(VARIANTS))]), capacity=capacity_table(model),
        elapsed_s=round(time.perf_counter() - t0, 1),
    )


def bench(args) -> dict:
    """The course bench's entry (registered by bench.py): `--workload fp8`, `--max-new-tokens` (default 64)."""
    from step01_kvcache.pretrained import load_model, load_tokenizer

    if args.workload not in (None, "fp8"):
        raise ValueError(f"chapter 6's CPU bench has one workload, fp8 (got {args.workload!r}); the kernels' "
                         "measurements need a GPU: python -m benchmarks.step06.fp8 (and .kernels, .engine, "
                         ".cascade)")
    return fp8_accuracy(load_model(args.model), load_tokenizer(args.model), args.max_new_tokens or NEW_TOKENS)
