"""The stress and fault probe: a seeded random run of every engine the course builds, under everything that can
happen to one at once.

The state machines of each chapter (tests/machines.py) explore short sequences of operations; this probe runs long
ones, on every combination the last chapter's `make_engine` offers on a CPU: each cache design (none, hash, radix,
bridge, offset) x each admission policy it accepts (fcfs, lpm, dfs-weight) x synchronous or overlapped steps x, for the
bridge, with or without its host tier; and each design (the bridge with and without its tier) decoding
speculatively, with drafts cut from the answer each request is known to give and followed by wrong tokens, so that
every verify step keeps some drafts and rolls the others back. Each runs the same stream of requests (greedy and
seeded sampling, stop tokens, prompts that share prefixes, some repeated whole), arriving at random between steps,
in pools small enough that preemption and eviction happen all the time, with bursts of arrivals that fill every
seat so that running requests outgrow the pool (preemption storms), random aborts, and forwards that raise
(`InjectedFault`, before or after the real forward ran).

What must hold: every request that was not aborted gives the tokens step01's `generate` gives without any cache;
`check_invariants()` passes after every step, a step that raised included, and the next step carries on; a drained
engine holds nothing for requests, and after `reset_cache()` every block is free again.

    python -m tests.stress --requests 1300 --seed 0    # requests per combination; exits 1 on any failure

`tests/test_stress.py` runs a short probe in `make test`; `make stress` runs a long one.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import random
import sys
import time

import torch

from step01_kvcache.generate import SamplingParams, generate
from step02_paged import Engine, EngineConfig
from step02_paged.forward_batch import ForwardBatch
from step02_paged.model_runner import ModelRunner
from step02_paged.paged_attention import PagedAttention
from step04_radix.policy import POLICIES, make_policy
from step05_bridge import BridgeKVCacheManager, SpeculativeConfig
from step05_bridge.host_pool import HostPool
from step05_bridge.speculative_engine import SpeculativeEngine
from step06_triton.engine import PREFIX_CACHES
from step06_triton.overlap import OverlapEngine
from tests.driver import shared_prompts
from tests.machines import MODEL

POOL_TOKENS = 96  # KV slots of every pool: a few requests at a time, so preemption and eviction are the rule
HOST_BLOCKS = 8  # the bridge's host tier, when it has one
MAX_NEW = 12
FAULT_RATE = 0.02  # the chance that a forward raises
ABORT_RATE = 0.05  # the chance that a live request is aborted before a step
STORM_RATE = 0.015  # the chance that a burst arrives before a step (else one request, a step in five)


class InjectedFault(RuntimeError):
    """Raised by the probe's runner in place of a forward; nothing else may raise out of a step."""


class FaultyRunner(ModelRunner):
    """Chapter 2's runner, except that a forward raises now and then: before the model runs, or after it wrote the
    step's K/V (the engine must then recompute them, since it moved no counter)."""

    def __init__(self, model, attention, pool, rng: random.Random, rate: float) -> None:
        super().__init__(model, attention, pool)
        self.rng, self.rate, self.faults = rng, rate, 0

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        fault, late = self.rng.random() < self.rate, self.rng.random() < 0.5
        if fault and not late:
            self.faults += 1
            raise InjectedFault("before the forward")
        logits = super().forward(batch)
        if fault:
            self.faults += 1
            raise InjectedFault("after the forward")
        return logits


@dataclasses.dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    params: SamplingParams

    @functools.cached_property
    def expected(self) -> list[int]:
        """The answer without any cache: what every engine must give."""
        return generate(MODEL, list(self.prompt), self.params, use_cache=False)


def requests(n: int, seed: int) -> list[Request]:
    """`n` requests: prompts that share prefixes of one stem (a fifth repeat an earlier prompt whole), half of them
    greedy and half sampled with their own seed; a quarter stop at a token their answer is known to reach."""
    rng = random.Random(seed)
    prompts = [tuple(p) for p in shared_prompts(n, seed, stem=48)]
    out: list[Request] = []
    for i, prompt in enumerate(prompts):
        if i and rng.random() < 0.2:
            prompt = rng.choice(out).prompt
        sampled = rng.random() < 0.5
        params = SamplingParams(max_new_tokens=rng.randint(1, MAX_NEW), temperature=rng.choice((0.7, 1.0, 1.5)) if
                                sampled else 0.0, top_p=rng.choice((0.8, 0.95, 1.0)), seed=rng.randrange(2**31))
        req = Request(prompt, params)
        if rng.random() < 0.25:  # stop at a token the answer reaches: the stop really ends it early
            stop = rng.choice(req.expected)
            req = Request(prompt, dataclasses.replace(params, stop_token_ids=(stop, rng.randrange(256))))
        out.append(req)
    return out


class DraftsFromTheAnswer:
    """The probe's proposer: the answer a live request is known to give (`Request.expected`, greedy or sampled),
    from a random point on replaced by tokens that are not the answer's."""

    def __init__(self, live: dict, rng: random.Random) -> None:
        self.live, self.rng = live, rng

    def propose(self, seq, max_tokens: int) -> list[int]:
        truth, done = self.live[seq.seq_id].expected, len(seq.output_ids)
        good = min(self.rng.randint(0, max(max_tokens, 0)), len(truth) - done)
        wrong = [(truth[i] + 1) % 256 if i < len(truth) else 0 for i in range(done + good, done + max(max_tokens, 0))]
        return truth[done: done + good] + wrong

    def drop(self, seq_id: int) -> None:
        """Nothing kept per request."""

    def tracked(self) -> set[int]:
        return set()


@dataclasses.dataclass(frozen=True)
class Combo:
    design: str
    policy: str
    overlap: bool
    host_blocks: int = 0
    speculative: bool = False  # synchronous steps with up to 4 drafts (DraftsFromTheAnswer)

    def __str__(self) -> str:
        host = f" host={self.host_blocks}" if self.host_blocks else ""
        steps = "overlap" if self.overlap else "spec" if self.speculative else "sync"
        return f"{self.design}/{self.policy}/{steps}{host}"

    def build(self, rng: random.Random, fault_rate: float) -> Engine:
        """The engine as `make_engine` builds it on a CPU (torch attention), through the same seams: its runner the
        faulty one, its pool sized in tokens (block size 1 for the radix design, one of 2, 4, 8 otherwise), the host
        tier loading back any prefix of a block or more. Raises ValueError for a combination the engine refuses."""
        block = 1 if self.design == "radix" else rng.choice((2, 4, 8))
        config = EngineConfig(num_blocks=POOL_TOKENS // block, block_size=block, max_num_seqs=rng.randint(3, 6),
                              max_num_batched_tokens=rng.choice((16, 24, 48)))
        manager = functools.partial(BridgeKVCacheManager, host_blocks=self.host_blocks, min_load_tokens=block) \
            if self.host_blocks else PREFIX_CACHES[self.design]
        runner = functools.partial(FaultyRunner, rng=rng, rate=fault_rate)
        args = (MODEL, config, manager, PagedAttention, make_policy(self.policy), runner)
        if self.speculative:
            return SpeculativeEngine(*args, speculative=SpeculativeConfig(num_speculative_tokens=4))
        return (OverlapEngine if self.overlap else Engine)(*args)


def combos() -> list[Combo]:
    """Every design x every policy x overlap off and on; the bridge with and without its host tier (the engine
    refuses the pairs that do not fit: `run` skips those); every design decoding speculatively, first come first
    served (the overlapped engine refuses drafts)."""
    tiers = {d: (0, HOST_BLOCKS) if d == "bridge" else (0,) for d in PREFIX_CACHES}
    return [Combo(d, p, o, h) for d in PREFIX_CACHES for p in POLICIES for o in (False, True) for h in tiers[d]] + \
        [Combo(d, "fcfs", False, h, speculative=True) for d in PREFIX_CACHES for h in tiers[d]]


@dataclasses.dataclass
class Counts:
    combos: int = 0
    requests: int = 0
    finished: int = 0
    aborted: int = 0
    faults: int = 0
    preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens served from the cache (first admissions)
    host_loads: int = 0  # blocks the bridge's host tier copied back to the device
    drafts: int = 0  # draft tokens verified (speculative combinations)
    accepted: int = 0  # of those, the ones kept
    steps: int = 0
    mismatches: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)  # mismatches, invariants, leaks: each named

    def add(self, other: Counts) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def __str__(self) -> str:
        return (f"{self.requests:,} requests, {self.finished:,} finished, {self.aborted:,} aborted, "
                f"{self.faults:,} faults injected, {self.preemptions:,} preemptions, {self.cached_tokens:,} cached "
                f"tokens, {self.host_loads:,} host blocks loaded, {self.accepted:,} of {self.drafts:,} drafts kept, "
                f"{self.steps:,} steps, {self.mismatches} mismatches, "
                f"{len(self.failures)} failures")


def probe(combo: Combo, stream: list[Request], seed: int, fault_rate: float = FAULT_RATE) -> Counts:
    """Run `stream` through `combo`'s engine (random arrivals, storms, aborts, faults), drain it, reset its cache."""
    rng = random.Random(f"{seed}/{combo}")
    engine = combo.build(rng, fault_rate)
    counts, live, arriving = Counts(combos=1), {}, iter(stream)
    if combo.speculative:
        engine.proposer = DraftsFromTheAnswer(live, rng)

    def retire(out) -> None:
        req = live.pop(out.seq_id)
        counts.preemptions += out.num_preemptions
        counts.aborted += out.aborted
        counts.finished += not out.aborted
        if not out.aborted and out.output_ids != req.expected:
            counts.mismatches += 1
            counts.failures.append(f"{combo}: request {out.seq_id} {req} gave {out.output_ids}, "
                                   f"expected {req.expected}")

    try:
        while counts.requests < len(stream) or engine.has_unfinished():
            storm = rng.random() < STORM_RATE  # many at once: every seat fills and the running outgrow the pool
            for req in itertools.islice(arriving, 2 * engine.config.max_num_seqs if storm else rng.random() < 0.2):
                live[engine.add_request(list(req.prompt), req.params)] = req
                counts.requests += 1
            if live and rng.random() < ABORT_RATE:
                retire(engine.abort(rng.choice(sorted(live))))
                engine.check_invariants()
            try:
                for out in engine.step():
                    retire(out)
            except InjectedFault:
                pass
            counts.steps += 1
            engine.check_invariants()
        assert not live, f"requests {sorted(live)} never finished"
        engine.check_invariants()  # drained: it holds no memory for requests (the engine's own rule)
        engine.cache_manager.reset_cache()
        engine.check_invariants()
        host = host_pool(engine)
        for bm in [engine.cache_manager.block_manager] + ([host.block_manager] if host else []):
            assert bm.num_free == bm.num_blocks, f"{bm.num_blocks - bm.num_free} blocks still held after reset_cache"
    except Exception as e:  # an invariant, a leak, or a step that raised something other than the injected fault
        counts.failures.append(f"{combo}: after {counts.steps} steps: {type(e).__name__}: {e}")
    counts.faults = engine.runner.faults
    counts.cached_tokens = engine.cache_manager.stats.hit_tokens
    counts.host_loads = host.blocks_loaded if (host := host_pool(engine)) else 0
    if isinstance(engine, SpeculativeEngine):
        counts.drafts, counts.accepted = engine.stats.draft_tokens, engine.stats.accepted_tokens
    return counts


def host_pool(engine: Engine) -> HostPool | None:
    """The bridge's host tier, once its first eviction made it."""
    return getattr(engine.cache_manager, "host", None)


def run(requests_per_combo: int, seed: int, fault_rate: float = FAULT_RATE, only: str = "", log=None) -> Counts:
    """The probe over every combination the engine accepts (whose name contains `only`); `log(line)` hears of each
    as it ends."""
    stream = requests(requests_per_combo, seed)
    total = Counts()
    for combo in combos():
        if only not in str(combo):
            continue
        try:
            counts = probe(combo, stream, seed, fault_rate)
        except ValueError as e:
            if log:
                log(f"{combo}: refused ({e})")
            continue
        total.add(counts)
        if log:
            log(f"{combo}: {counts}")
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1300, help="requests per combination (default 1300)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fault-rate", type=float, default=FAULT_RATE, help="the chance that a forward raises")
    ap.add_argument("--only", default="", help="only the combinations whose name contains this, e.g. bridge/lpm")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # a tiny model: thread start-up costs more than its matmuls (as in tests/conftest.py)
    start = time.perf_counter()
    total = run(args.requests, args.seed, args.fault_rate, args.only, log=functools.partial(print, flush=True))
    print(f"\n{total.combos} combinations, seed {args.seed}: {total}; {time.perf_counter() - start:.0f} s")
    for line in total.failures[:20]:
        print("FAILED", line)
    return 1 if total.failures or not total.combos else 0


if __name__ == "__main__":
    sys.exit(main())
