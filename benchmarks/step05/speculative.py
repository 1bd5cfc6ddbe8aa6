"""`python -m course bench step05 --workload speculative`: speculative decoding with prompt lookup against plain
decoding, on the real model, at batch 1 and 8, on a workload whose answers copy from their prompt (`edit`) and on
the chat workloads (`short`, `batch`).

Decode throughput is what speculation changes (a prompt is prefilled the same way either way), so the bench clocks
decode steps only: a step in which every scheduled sequence was decoding (its prompt done, no request waiting).
Per run it reports decode tokens/s, how many draft tokens were verified and accepted, and tokens per sequence and
decode step; plain and speculative runs alternate within each round, best of the rounds, and their answers must
be the same tokens. Chat answers repeat their own phrases often enough that prompt lookup drafts on every
workload of the course, so what speculation costs where nothing is proposed is measured with a third engine on
`short`: speculation on, its proposer keeping its index as usual but never drafting (`NoDrafts`).

`verify_step_cost` is the other half of the trade: the time of one verify step of 1 + k tokens per sequence against
a plain decode step, on whatever device the model is on (CUDA events on a GPU), without the engine around it.
"""
from __future__ import annotations

import time
from statistics import median

import torch

from step01_kvcache.generate import SamplingParams
from step02_paged.attention_backend import AttentionBackend
from step02_paged.config import EngineConfig
from step02_paged.engine import Engine
from step02_paged.forward_batch import ForwardBatch
from step02_paged.geometry import cdiv
from step02_paged.paged_attention import PagedAttention
from step02_paged.sequence import Sequence
from step05_bridge.ngram_proposer import NgramProposer
from step05_bridge.speculative_config import SpeculativeConfig
from step05_bridge.speculative_engine import SpeculativeEngine, SpeculativeStats

WORKLOADS = ("edit", "short", "batch")
CONTROL = "short"  # the workload also run with speculation on and nothing proposed


class NoDrafts(NgramProposer):
    """Prompt lookup that indexes every token as usual and never proposes: speculation on, nothing proposed."""

    def propose(self, seq: Sequence, max_tokens: int) -> list[int]:
        return super().propose(seq, 0)


def run_clocked(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> dict:
    """Run `prompts` together to the end, clocking the decode steps: those in which no request waits and every
    scheduled sequence decodes. Returns the answers and the decode steps' tokens, sequence-steps and seconds."""
    ids = [engine.add_request(p, params) for p in prompts]
    done, tokens, seq_steps, seconds = {}, 0, 0, 0.0
    while engine.has_unfinished():
        running = engine.scheduler.running
        decoding = not engine.scheduler.waiting and all(s.num_tokens - s.num_computed_tokens == 1 for s in running)
        before = sum(len(s.output_ids) for s in engine.seqs.values())
        t0 = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t0
        for out in outs:
            done[out.seq_id] = out
        if decoding:
            after = sum(len(s.output_ids) for s in engine.seqs.values()) + sum(len(o.output_ids) for o in outs)
            tokens += after - before
            seq_steps += len(engine.last_scheduled)
            seconds += dt
    return dict(outputs=[done[i].output_ids for i in ids], tokens=tokens, seq_steps=seq_steps, seconds=seconds)


def run_workload(model, cfg: EngineConfig, spec: SpeculativeConfig | None, prompts: list[list[int]],
                 params: SamplingParams, batch: int, drafts: bool = True) -> dict:
    """`prompts` through a fresh engine (speculative with `spec`), `batch` at a time, in order; the decode clocks
    summed. `drafts=False` keeps speculation on with a proposer that never drafts."""
    if spec:
        engine = SpeculativeEngine(model, cfg, proposer=None if drafts else NoDrafts.from_config(spec),
                                   speculative=spec)
    else:
        engine = Engine(model, cfg)
    runs = [run_clocked(engine, prompts[i: i + batch], params) for i in range(0, len(prompts), batch)]
    total = {key: sum(r[key] for r in runs) for key in ("tokens", "seq_steps", "seconds")}
    s = engine.stats if isinstance(engine, SpeculativeEngine) else SpeculativeStats()
    return dict(total, outputs=[o for r in runs for o in r["outputs"]], draft_tokens=s.draft_tokens,
                accepted_tokens=s.accepted_tokens, acceptance_rate=s.acceptance_rate)


def tokens_per_s(run: dict) -> float:
    return run["tokens"] / run["seconds"]


def spec_bench(model, tokenizer, k: int = 4, batches: tuple[int, ...] = (1, 8), max_new_tokens: int = 128,
               repeats: int = 2, workloads: tuple[str, ...] = WORKLOADS, progress=lambda items, desc: items,
               cost_ks=range(1, 9), cost_context: int = 256) -> dict:
    """Every workload at every batch size, plain (k = 0) and speculative (k drafts), and on `CONTROL` speculative
    with nothing proposed too, the engines alternating within each round; the fastest decode of each over `repeats`
    rounds. Then `verify_step_cost` on the same machine."""
    from course.chat import stop_ids
    from course.workloads import get_workload

    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop_ids(tokenizer))
    spec = SpeculativeConfig(k)
    rows = []
    plan = [(w, b) for w in workloads for b in batches]
    for name, batch in progress(plan, "workload x batch"):
        prompts = get_workload(name).prompts(tokenizer)
        cfg = EngineConfig(num_blocks=1024, block_size=16, max_num_seqs=batch, max_num_batched_tokens=512)
        runs = {"plain": (None, True), "spec": (spec, True)}
        if name == CONTROL:
            runs["nothing"] = (spec, False)
        best: dict[str, dict] = {}
        for _ in range(repeats):
            for key, (on, drafts) in runs.items():
                run = run_workload(model, cfg, on, prompts, params, batch, drafts)
                if key not in best or run["seconds"] < best[key]["seconds"]:
                    best[key] = run
        off, on = best["plain"], best["spec"]
        row = dict(
            workload=name, batch=batch, requests=len(prompts), decode_tokens=on["tokens"],
            plain_tokens_per_s=round(tokens_per_s(off), 2), spec_tokens_per_s=round(tokens_per_s(on), 2),
            speedup=round(tokens_per_s(on) / tokens_per_s(off), 3),
            drafts_per_step=round(on["draft_tokens"] / on["seq_steps"], 3),
            acceptance_rate=round(on["acceptance_rate"], 3),
            tokens_per_step=round(on["tokens"] / on["seq_steps"], 3),
            plain_steps=off["seq_steps"], spec_steps=on["seq_steps"],
            outputs_identical=on["outputs"] == off["outputs"])
        if "nothing" in best:
            nothing = best["nothing"]
            assert nothing["draft_tokens"] == 0 and nothing["outputs"] == off["outputs"]
            row.update(nothing_proposed_tokens_per_s=round(tokens_per_s(nothing), 2),
                       nothing_proposed_speedup=round(tokens_per_s(nothing) / tokens_per_s(off), 3))
        rows.append(row)
    control = [r for r in rows if "nothing_proposed_speedup" in r]
    worst = min(control, key=lambda r: r["nothing_proposed_speedup"]) if control else None
    return dict(chapter="step05", workload="speculative", num_speculative_tokens=k, max_new_tokens=max_new_tokens,
                repeats=repeats, prompt_lookup=[spec.prompt_lookup_min, spec.prompt_lookup_max],
                rows=rows,
                nothing_proposed=worst and dict(workload=worst["workload"], batch=worst["batch"],
                                                speedup=worst["nothing_proposed_speedup"]),
                verify_cost=verify_step_cost(model, ks=cost_ks, batch_sizes=batches, context=cost_context, repeats=5))


def verify_step_cost(model, ks=range(1, 9), batch_sizes=(1, 8), context: int = 512, repeats: int = 20,
                     attention: AttentionBackend = PagedAttention, block_size: int = 16, timer=None) -> dict:
    """One forward of a verify step (1 + k tokens for each of `batch` sequences with `context` tokens of K/V) against
    a plain decode step (1 token each), on the device of `model`, through chapter 2's runner and `attention`: the
    median of `repeats` timed forwards after a warm-up, with CUDA events on a GPU (perf_counter on a CPU), or
    `timer(engine, batch)` in ms when given (chapter 6's GPU measurement replays the forward from a graph). Returns
    {"device", "dtype", "context", "batches": {batch: {"decode_ms", "verify_ms": {k: ms}, "ratio": {k: x}}}}: a
    speculative step pays `ratio` decode steps and yields 1 + (accepted drafts) tokens."""
    device = next(model.parameters()).device
    ks = list(ks)
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "dtype": str(model.dtype).removeprefix("torch."), "context": context, "repeats": repeats, "batches": {}}
    vocab = model.config.vocab_size
    for batch in batch_sizes:
        need = cdiv(context + max(ks) + 1, block_size) * batch
        engine = Engine(model, EngineConfig(num_blocks=need, block_size=block_size, max_num_seqs=batch),
                        attention=attention)
        gen = torch.Generator().manual_seed(batch)
        seqs = []
        for _ in range(batch):  # admitted by hand: blocks for the context and the drafts, the counter past the context
            # (the context's K/V are whatever the pool holds: a forward's time does not depend on the values)
            prompt = torch.randint(vocab, (context + 1,), generator=gen).tolist()
            seq = engine.cache_manager.new_sequence(len(seqs), prompt, SamplingParams(max_new_tokens=max(ks) + 1))
            assert engine.cache_manager.allocate_slots(seq, context + 1 + max(ks))
            seq.admit(0)
            seq.advance(context)
            seqs.append(seq)
        timings = {}
        for k in [0] + ks:  # k = 0: the plain decode step
            for seq in seqs:  # k drafts each (their values do not change a forward's time)
                seq.spec_token_ids = torch.randint(vocab, (k,), generator=gen).tolist()
            fb = ForwardBatch.build(seqs, [k + 1] * batch, engine.block_table, block_size, list(range(batch)))
            timings[k] = timer(engine, fb) if timer else _median_forward_ms(engine, fb, repeats)
        decode = timings.pop(0)
        out["batches"][batch] = {"decode_ms": round(decode, 4),
                                 "verify_ms": {k: round(t, 4) for k, t in timings.items()},
                                 "ratio": {k: round(t / decode, 3) for k, t in timings.items()}}
    return out


@torch.inference_mode()
def _median_forward_ms(engine: Engine, batch: ForwardBatch, repeats: int) -> float:
    """The median time of the runner's forward over `batch` (K/V written past the counters, where nothing reads)."""
    cuda = batch.input_ids.is_cuda
    engine.runner.forward(batch)  # warm-up
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            engine.runner.forward(batch)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            engine.runner.forward(batch)
            times.append((time.perf_counter() - t0) * 1e3)
    return median(times)
