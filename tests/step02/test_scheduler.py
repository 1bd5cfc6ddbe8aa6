"""Scheduler.schedule, graded alone: it runs over a stand-in cache manager written here (it counts the blocks each
sequence's tokens fill, nothing else of chapter 2 runs), and the tests move the sequences as the engine does after
each step (`advance` what ran, a sampled token for those that ran all their pending tokens), without a model. So
task2.schedule needs no other task of the chapter."""
from __future__ import annotations

import random

import pytest

from step01_kvcache.request import SamplingParams
from step02_paged import EngineConfig, PrefixMatch
from step02_paged.cache_manager import CacheManager
from step02_paged.geometry import PoolGeometry
from step02_paged.scheduler import Scheduler
from step02_paged.sequence import Sequence


class StandInManager(CacheManager):
    """A cache manager that only counts: a running sequence holds ceil(tokens / block_size) blocks for the tokens it
    was given room for; allocation is all or nothing. It finds no prefix (as chapter 2's paging)."""

    design = "stand-in"

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(PoolGeometry(num_blocks, block_size))
        self.held: dict[int, int] = {}  # seq_id -> blocks
        self.peak = 0

    def new_sequence(self, seq_id: int, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        return Sequence(seq_id, prompt_ids, params)

    def get_computed_blocks(self, seq: Sequence) -> PrefixMatch:
        return PrefixMatch()

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        assert num_new_tokens > 0, f"room asked for {num_new_tokens} tokens of sequence {seq.seq_id}"
        computed = seq.num_computed_tokens if seq.seq_id in self.holders else 0
        want = -(-(computed + num_new_tokens) // self.block_size)
        more = want - self.held.get(seq.seq_id, 0)
        if more > self.num_blocks - self.num_held_blocks():
            return False
        self.held[seq.seq_id] = max(want, self.held.get(seq.seq_id, 0))
        self.holders[seq.seq_id] = seq
        self.peak = max(self.peak, self.num_held_blocks())
        return True

    def on_computed(self, seq: Sequence) -> None:
        pass

    def free(self, seq: Sequence) -> None:
        self.held.pop(seq.seq_id, None)
        self.holders.pop(seq.seq_id, None)

    def num_held_blocks(self) -> int:
        return sum(self.held.values())

    def check_invariants(self) -> None:
        assert self.num_held_blocks() <= self.num_blocks


def scheduler(num_blocks=64, block_size=4, **budget) -> Scheduler:
    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, **budget)
    return Scheduler(config, StandInManager(num_blocks, block_size))


def add(sched: Scheduler, seq_id: int, prompt_len: int, new_tokens: int) -> Sequence:
    seq = sched.cache_manager.new_sequence(seq_id, [seq_id] * prompt_len, SamplingParams(max_new_tokens=new_tokens))
    sched.add(seq)
    return seq


def step(sched: Scheduler) -> list[tuple[Sequence, int]]:
    """One engine step around `schedule`, with the checks that hold for every step of every schedule."""
    waiting_before = list(sched.waiting)
    batch = sched.schedule()
    cfg = sched.config
    assert sum(n for _, n in batch) <= cfg.max_num_batched_tokens, "over the token budget"
    assert len(sched.running) <= cfg.max_num_seqs, "more running sequences than seats"
    assert len({s.seq_id for s, _ in batch}) == len(batch), "a sequence scheduled twice"
    for seq, n in batch:
        assert seq in sched.running and 0 < n <= seq.num_pending_tokens, f"sequence {seq.seq_id}: {n} tokens"
        assert cfg.enable_chunked_prefill or n == seq.num_pending_tokens, "a prefill split without chunked prefill"
        assert sched.cache_manager.held[seq.seq_id] * cfg.block_size >= seq.num_computed_tokens + n, \
            f"sequence {seq.seq_id} runs {n} tokens it has no room for"
    for seq in sched.preempted:
        assert seq in sched.waiting and seq.num_computed_tokens == 0 and seq.seq_id not in sched.cache_manager.held
    if sched.preempted:
        assert not [s for s in sched.running if s in waiting_before], "admitted in a step that preempted"
    for seq, n in batch:
        sampled = n == seq.num_pending_tokens
        seq.advance(n)
        if sampled:
            seq.append_token(seq.seq_id)
            if seq.is_finished:
                sched.finish(seq)
    return batch


def run_to_end(sched: Scheduler, limit: int = 2000) -> list[list[tuple[int, int]]]:
    steps = []
    while sched.has_unfinished():
        assert len(steps) < limit, "the scheduler stopped making progress"
        steps.append([(s.seq_id, n) for s, n in step(sched)])
    return steps


@pytest.mark.task("task2.schedule")
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("num_blocks", [12, 200])
def test_every_request_runs_to_its_end_within_budget_seats_and_blocks(chunked, num_blocks):
    """Ragged requests on a roomy pool and on one small enough to preempt: every step keeps the budget, the seats
    and the pool; every request gets all its tokens; the scheduler ends with nothing held."""
    sched = scheduler(num_blocks, 4, max_num_seqs=4, max_num_batched_tokens=40, enable_chunked_prefill=chunked)
    rng = random.Random(num_blocks)
    seqs = [add(sched, i, rng.randint(1, 30), rng.randint(1, 12)) for i in range(10)]
    run_to_end(sched)
    assert all(len(s.output_ids) == s.params.max_new_tokens for s in seqs)
    assert not sched.cache_manager.held and not sched.running and not sched.waiting
    assert sched.cache_manager.peak <= num_blocks
    assert (sum(s.num_preemptions for s in seqs) > 0) == (num_blocks == 12), "preempted exactly when the pool is small"


@pytest.mark.task("task2.schedule")
def test_decodes_are_batched_with_a_prefill_chunk():
    """Continuous batching: while a long prompt prefills in chunks, the running decode keeps stepping, first."""
    sched = scheduler(max_num_batched_tokens=16)
    short = add(sched, 0, 3, 20)
    assert [(s.seq_id, n) for s, n in step(sched)] == [(0, 3)]
    add(sched, 1, 100, 2)
    assert [(s.seq_id, n) for s, n in step(sched)] == [(0, 1), (1, 15)]  # one decode + a 15-token chunk
    assert [(s.seq_id, n) for s, n in step(sched)] == [(0, 1), (1, 15)]
    assert short.num_computed_tokens == 5


@pytest.mark.task("task2.schedule")
def test_without_chunked_prefill_a_prompt_waits_for_a_step_it_fits():
    sched = scheduler(max_num_batched_tokens=16, enable_chunked_prefill=False)
    add(sched, 0, 10, 3)
    add(sched, 1, 10, 3)
    assert [(s.seq_id, n) for s, n in step(sched)] == [(0, 10)]  # 10 + 10 > 16: the second waits
    assert [(s.seq_id, n) for s, n in step(sched)] == [(0, 1), (1, 10)]


@pytest.mark.task("task2.schedule")
def test_admission_stops_at_the_seats():
    sched = scheduler(max_num_seqs=2)
    for i in range(3):
        add(sched, i, 4, 2)
    assert [(s.seq_id, n) for s, n in step(sched)] == [(0, 4), (1, 4)]
    assert [s.seq_id for s in sched.waiting] == [2]


@pytest.mark.task("task2.schedule")
def test_the_most_recent_sequence_is_preempted_and_queued_first():
    """Three sequences fill the pool; when the first needs a new block, the last admitted gives its blocks back,
    goes to the front of the queue with its computed tokens forgotten (its sampled token kept, to be recomputed
    with the prompt), and nobody is admitted that step."""
    sched = scheduler(num_blocks=6, block_size=4, max_num_seqs=8)
    seqs = [add(sched, i, 8, 8) for i in range(3)]  # 8 tokens each: two full blocks each, the whole pool
    add(sched, 3, 1, 1)  # waits: no block free
    assert [(s.seq_id, n) for s, n in step(sched)] == [(0, 8), (1, 8), (2, 8)]
    batch = step(sched)  # each decode needs a third block: 2 gives its two back, 0 and 1 take them
    assert [s.seq_id for s in sched.preempted] == [2]
    assert [(s.seq_id, n) for s, n in batch] == [(0, 1), (1, 1)]
    assert [s.seq_id for s in sched.waiting] == [2, 3] and seqs[2].num_preemptions == 1
    assert seqs[2].num_computed_tokens == 0 and seqs[2].num_pending_tokens == 9
    assert len(seqs[2].output_ids) == 1, "a preempted sequence keeps the tokens it sampled"
    run_to_end(sched)
    assert all(len(s.output_ids) == 8 for s in seqs)


@pytest.mark.task("task2.schedule")
def test_nothing_is_admitted_in_a_step_that_preempted():
    """A decodes, B prefills in chunks under a 4-token budget, and the pool is full: B's next chunk needs a block,
    so B (the most recent) is preempted. The block it gave back would take a new 3-token chunk of it, but a step
    that preempted admits nobody: the pool is tight."""
    sched = scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=4)
    a, b = add(sched, 0, 8, 20), add(sched, 1, 8, 20)
    assert [(s.seq_id, n) for s, n in step(sched)] == [(0, 4)]
    assert [(s.seq_id, n) for s, n in step(sched)] == [(0, 4)]
    assert [(s.seq_id, n) for s, n in step(sched)] == [(0, 1), (1, 3)]  # A: 3 blocks, B: 1, none free
    assert [(s.seq_id, n) for s, n in step(sched)] == [(0, 1)]
    assert sched.preempted == [b] and list(sched.waiting) == [b] and sched.running == [a]

