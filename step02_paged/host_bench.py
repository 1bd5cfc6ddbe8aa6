"""`python -m course bench step02 --workload host`: what the engine's host does per decode step, without a model.

On a GPU the host prepares step N+1 while (with overlap) or before (without) the device runs step N, so the
host's microseconds per step are either hidden or added to every token. This bench measures them alone: the
model is a stand-in that returns zeros at once and never attends (`NullModel`, `NoAttention`: on a GPU the
attention is the device's work), and everything else is the real engine — the scheduler, the cache manager,
the persistent block table, the step's `ForwardBatch`, sampling, bookkeeping. 64 sequences decode side by side
at contexts of 512 to 16,384 tokens, for every chapter's cache manager. Work per step must follow what the step
runs (64 tokens, a block now and then), not what the sequences hold: the time per step should not grow with
the context.
"""
from __future__ import annotations

import importlib
import pkgutil
import time
from pathlib import Path
from statistics import median

import torch

from step01_kvcache.config import ModelConfig
from step01_kvcache.request import SamplingParams

from .cache_manager import CacheManager, cdiv
from .config import EngineConfig
from .engine import Engine
from .forward_batch import ForwardBatch
from .kv_pool import KVPool

CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384)
SEQS, STEPS = 64, 48


class NullModel:
    """The model's interface with no arithmetic: hidden states and logits of zeros (greedy picks token 0)."""

    def __init__(self, max_len: int) -> None:
        self.config = ModelConfig(vocab_size=128, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
                                  num_kv_heads=1, head_dim=2, max_position_embeddings=max_len)
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: object) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], self.config.hidden_size)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden.shape[0], self.config.vocab_size)


class NoAttention:
    """An attention backend with no host work per step: the batch goes to the kernels as it is (chapter 6)."""

    @classmethod
    def for_step(cls, pool: KVPool, batch: ForwardBatch) -> NoAttention:
        return cls()


def cache_managers() -> dict[str, type[CacheManager]]:
    """Every chapter's cache manager, by its `design` name. Chapters are found, not named: importing each
    `stepNN_*` package lets its manager join."""
    root = Path(__file__).resolve().parent.parent
    for info in pkgutil.iter_modules([str(root)]):
        if info.name.startswith("step0") and info.ispkg:
            importlib.import_module(info.name)
    found, stack = {}, [CacheManager]
    while stack:
        for cls in stack.pop().__subclasses__():
            stack.append(cls)
            if cls.__module__.startswith("step0") and "design" in cls.__dict__:
                found.setdefault(cls.design, cls)
    return dict(sorted(found.items(), key=lambda kv: kv[1].__module__))


def host_us_per_step(manager: type[CacheManager], context: int, block_size: int, seqs: int = SEQS,
                     steps: int = STEPS, seed: int = 0) -> float:
    """Median microseconds of one `Engine.step()` with `seqs` sequences decoding at `context` tokens."""
    model = NullModel(context + steps + 64)
    num_blocks = seqs * cdiv(context + steps + 8, block_size) + 8
    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=seqs,
                          max_num_batched_tokens=seqs * context)  # every prompt in the first step
    engine = Engine(model, config, manager, NoAttention)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(seqs):  # random prompts: 64 different branches of a tree, nothing shared
        engine.add_request(torch.randint(1, 128, (context,), generator=gen), SamplingParams(max_new_tokens=steps + 8))
    engine.step()  # prefill everyone (not timed)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    assert len(engine.scheduler.running) == seqs, "every sequence was meant to decode in every timed step"
    return median(times) * 1e6


def host_bench(contexts: tuple[int, ...] = CONTEXTS, rounds: int = 3,
               progress=lambda items, desc: items) -> dict:
    """host_us_per_step[manager][context] for every chapter's manager (the radix tree at block size 1, the others
    at 16), and the ratio of the longest context to the shortest (flat is 1). Each cell is the best of `rounds`
    medians, the rounds going over every cell in turn, so that a burst of load on a shared machine lands on one
    round of several cells rather than on all rounds of one."""
    managers = cache_managers()
    cells = [(name, c) for name in managers for c in contexts]
    best: dict[tuple[str, int], float] = {}
    for r in range(rounds):
        for name, c in progress(cells, f"host bench, round {r + 1} of {rounds}"):
            block_size = 1 if name == "radix" else EngineConfig.block_size
            us = host_us_per_step(managers[name], c, block_size)
            best[name, c] = min(best.get((name, c), us), us)
    table = {name: {c: round(best[name, c], 1) for c in contexts} for name in managers}
    growth = {name: round(row[contexts[-1]] / row[contexts[0]], 3) for name, row in table.items()}
    return dict(chapter="step02", workload="host", requests=SEQS, steps_timed=STEPS, rounds=rounds,
                contexts=list(contexts),
                host_us_per_step=table, growth_longest_over_shortest=growth,
                max_host_us_per_step=max(max(row.values()) for row in table.values()))
