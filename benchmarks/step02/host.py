"""`python -m course bench step02 --workload host`: what the engine's host does per decode step, without a model.

On a GPU the host prepares step N+1 while (chapter 6's overlapped engine) or before (chapter 2's) the device runs
step N, so the host's microseconds per step are either hidden or added to every token. This bench measures them
alone: the runner is a stand-in that returns zero logits at once (`NullRunner`: on a GPU the forward is the
device's work), and everything else is the real engine — the scheduler, the cache manager, the persistent block
table, the step's `ForwardBatch`, sampling, bookkeeping. 64 sequences decode side by side at contexts of 512 to
16,384 tokens, for every chapter's cache manager. Work per step must follow what the step runs (64 tokens, a block
now and then), not what the sequences hold: the time per step should not grow with the context. Where the time
goes is timed through the engine's own parts: `ClockedEngine` overrides each method of a step to call chapter 2's
with a clock around it.
"""
from __future__ import annotations

import cProfile
import pstats
import time
from collections import Counter
from pathlib import Path
from statistics import median

import torch

from step01_kvcache.config import ModelConfig
from step01_kvcache.request import SamplingParams
from step02_paged.cache_manager import CacheManager
from step02_paged.config import EngineConfig
from step02_paged.engine import Engine
from step02_paged.forward_batch import ForwardBatch
from step02_paged.geometry import cdiv
from step02_paged.kv_cache_manager import KVCacheManager
from step02_paged.model_runner import ModelRunner
from step02_paged.scheduler import Scheduler

CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384)
SEQS, STEPS, TURN = 64, 48, 8


class NullModel:
    """What the engine reads of a model, with no weights: its shape, device and dtype."""

    def __init__(self, max_len: int) -> None:
        self.config = ModelConfig(vocab_size=128, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
                                  num_kv_heads=1, head_dim=2, max_position_embeddings=max_len)
        self.device, self.dtype = torch.device("cpu"), torch.float32


class NullRunner(ModelRunner):
    """The runner's contract with no arithmetic: zero logits for the sampled rows (greedy picks token 0)."""

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return torch.zeros(batch.logits_indices.shape[0], self.model.config.vocab_size)


PARTS = {  # the parts of chapter 2's `Engine.step`, by the method that does each
    "_schedule": "schedule",
    "_prepare": "build the step's inputs (_prepare: ForwardBatch.build)",
    "_forward": "the model stand-in (runner.forward)",
    "_sample": "sample",
    "_advance": "advance the counters, publish (_advance: on_computed)",
    "_append": "append the tokens, retire (_append)",
    "_record_step": "statistics (_record_step)",
}


class ClockedScheduler(Scheduler):
    def __init__(self, *args, clock) -> None:
        super().__init__(*args)
        self.clock = clock

    def schedule(self) -> list:
        return self.clock("_schedule", super().schedule)


class ClockedRunner(NullRunner):
    def __init__(self, *args, clock) -> None:
        super().__init__(*args)
        self.clock = clock

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.clock("_forward", super().forward, batch)


class ClockedEngine(Engine):
    """Chapter 2's engine with a clock around each part of its step: `spent[part]` adds up the seconds."""

    def __init__(self, model: NullModel, config: EngineConfig, manager: type[CacheManager]) -> None:
        self.spent: Counter = Counter()
        super().__init__(model, config, manager, runner=lambda *args: ClockedRunner(*args, clock=self.clock))
        self.scheduler = ClockedScheduler(config, self.cache_manager, clock=self.clock)

    def clock(self, part: str, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.spent[part] += time.perf_counter() - t0

    def _prepare(self, *args):
        return self.clock("_prepare", super()._prepare, *args)

    def _sample(self, *args):
        return self.clock("_sample", super()._sample, *args)

    def _advance(self, *args):
        return self.clock("_advance", super()._advance, *args)

    def _append(self, *args):
        return self.clock("_append", super()._append, *args)

    def _record_step(self):
        return self.clock("_record_step", super()._record_step)


def cache_managers() -> dict[str, type[CacheManager]]:
    """Every chapter's cache manager, by its `design` name, in chapter order."""
    from step03_prefix_hash import PrefixCachingKVCacheManager
    from step04_radix import RadixKVCacheManager
    from step05_bridge import BridgeKVCacheManager

    managers = (KVCacheManager, PrefixCachingKVCacheManager, RadixKVCacheManager, BridgeKVCacheManager)
    return {m.design: m for m in managers}


def decoding_engine(manager: type[CacheManager], context: int, block_size: int, seqs: int = SEQS,
                    steps: int = STEPS, seed: int = 0, engine: type[Engine] = Engine) -> Engine:
    """An engine with `seqs` sequences of `context` random tokens, prefilled, each with `steps` + 8 tokens to go."""
    model = NullModel(context + steps + 64)
    num_blocks = seqs * cdiv(context + steps + 8, block_size) + 8
    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=seqs,
                          max_num_batched_tokens=seqs * context)  # every prompt in the first step
    if engine is Engine:
        e = Engine(model, config, manager, runner=NullRunner)
    else:
        e = engine(model, config, manager)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(seqs):  # random prompts: 64 different branches of a tree, nothing shared
        e.add_request(torch.randint(1, 128, (context,), generator=gen), SamplingParams(max_new_tokens=steps + 8))
    e.step()  # prefill everyone (not timed)
    return e


def host_us_per_step(manager: type[CacheManager], contexts: tuple[int, ...], block_size: int, seqs: int = SEQS,
                     steps: int = STEPS, seed: int = 0) -> dict[int, float]:
    """Median microseconds of one `Engine.step()` with `seqs` sequences decoding, at each of `contexts`. One engine
    per context, taking turns of `TURN` steps: every context is timed over the same seconds, so a machine whose
    speed drifts slows them all alike and their ratio stays true; within a turn an engine's data is back in the
    CPU's caches after its first step, as in an engine that runs alone (the median ignores that first step)."""
    engines = {c: decoding_engine(manager, c, block_size, seqs, steps, seed) for c in contexts}
    times: dict[int, list[float]] = {c: [] for c in contexts}
    for _ in range(0, steps, TURN):
        for c, engine in engines.items():
            for _ in range(TURN):
                t0 = time.perf_counter()
                engine.step()
                times[c].append(time.perf_counter() - t0)
    assert all(len(e.scheduler.running) == seqs for e in engines.values()), "every sequence decodes every step"
    return {c: median(ts) * 1e6 for c, ts in times.items()}


def host_profile(manager: type[CacheManager], context: int = CONTEXTS[0], steps: int = STEPS) -> dict:
    """Where a decode step's host time goes. `share`: each part of `Engine.step`, timed by `ClockedEngine`'s clock
    around the method that does it (a clock costs well under a microsecond); `top_functions`: the functions whose
    own code takes longest under cProfile (which slows small calls most, so read it as where to look, not as
    shares)."""
    block_size = 1 if manager.design == "radix" else EngineConfig.block_size
    engine = decoding_engine(manager, context, block_size, steps=steps, engine=ClockedEngine)
    plain = decoding_engine(manager, context, block_size, steps=steps)  # the same step without clocks, in turn
    per_step, plain_steps = [], []  # each step's time in each part, and in all: the medians resist a burst of load
    for _ in range(steps // 2):
        t0 = time.perf_counter()
        plain.step()
        plain_steps.append(time.perf_counter() - t0)
        engine.spent.clear()
        t0 = time.perf_counter()
        engine.step()
        per_step.append(dict(engine.spent, total=time.perf_counter() - t0))
    for row in per_step:
        row["other"] = row["total"] - sum(row.get(part, 0.0) for part in PARTS)
    typical = {PARTS.get(part, part): median(row.get(part, 0.0) for row in per_step) for part in [*PARTS, "other"]}
    total = sum(typical.values())
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [engine.step() for _ in range(steps // 2)])
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, primitive calls, tottime, cumtime, ...)
    own = sum(v[2] for v in stats.values())
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:6]
    return dict(manager=manager.design, context=context, steps=steps // 2,
                us_per_step=round(total * 1e6, 1), plain_us_per_step=round(median(plain_steps) * 1e6, 1),
                share={phase: round(t / total, 3) for phase, t in typical.items()},
                top_functions=[[f"{Path(f).name}:{n}", round(v[2] / own, 3)] for (f, _, n), v in top])


def host_bench(contexts: tuple[int, ...] = CONTEXTS, rounds: int = 3,
               progress=lambda items, desc: items) -> dict:
    """host_us_per_step[manager][context] for every chapter's manager (the radix tree at block size 1, the others
    at 16), and how much the longest context costs over the shortest (flat is 1). A cell is the median of the
    `rounds` medians; the growth is the row's longest cell over its shortest, and `growth_per_round` keeps the
    ratio within each round, whose contexts were timed step by step in turn (`host_us_per_step`)."""
    managers = cache_managers()
    runs: dict[tuple[str, int], list[float]] = {(name, c): [] for name in managers for c in contexts}
    for r in range(rounds):
        for name in progress(list(managers), f"host bench, round {r + 1} of {rounds}"):
            block_size = 1 if name == "radix" else EngineConfig.block_size
            for c, us in host_us_per_step(managers[name], contexts, block_size).items():
                runs[name, c].append(us)
    table = {name: {c: round(median(runs[name, c]), 1) for c in contexts} for name in managers}
    growth = {name: round(row[contexts[-1]] / row[contexts[0]], 3) for name, row in table.items()}
    return dict(chapter="step02", workload="host", requests=SEQS, steps_timed=STEPS, rounds=rounds,
                contexts=list(contexts), growth_per_round={name: [round(a / b, 3) for a, b in zip(
                    runs[name, contexts[-1]], runs[name, contexts[0]])] for name in managers},
                host_us_per_step=table, growth_longest_over_shortest=growth,
                max_host_us_per_step=max(max(row.values()) for row in table.values()),
                us_per_sequence_per_step={name: round(min(row.values()) / SEQS, 2) for name, row in table.items()},
                profile=[host_profile(managers[name], contexts[0]) for name in managers])
