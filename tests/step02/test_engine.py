"""The engine gives exactly step01's greedy tokens for ragged batches, whatever the paging parameters.

These are chapter 2's end-to-end tests: the engine runs every task of the chapter (and chapter 1), so each is tagged
with all of them, and waits for the ones still unsolved. Each task is also graded alone: test_block_manager.py,
test_paging.py, test_kv_cache_manager.py and test_scheduler.py."""
from __future__ import annotations

import random

import pytest

from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.tiny import tiny_model
from step02_paged import FCFS, Engine, EngineConfig, Policy
from tests.driver import drive_to_end, with_reference


def ragged_prompts(n: int, seed: int, lo: int = 1, hi: int = 200) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=11)


@pytest.fixture(scope="module")
def reference(model):
    return with_reference(model, ragged_prompts(6, seed=1) + [[7], [1, 2]], new_tokens=10)


@pytest.mark.task("task2.allocate_free")
@pytest.mark.task("task2.slot_mapping")
@pytest.mark.task("task2.paged_attention")
@pytest.mark.task("task2.allocate_slots")
@pytest.mark.task("task2.schedule")
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("chunked", [True, False])
def test_engine_matches_step01(model, reference, block_size, chunked):
    prompts, params, expected = reference
    cfg = EngineConfig(num_blocks=2048 // block_size, block_size=block_size, max_num_seqs=4,
                       max_num_batched_tokens=48 if chunked else 256, enable_chunked_prefill=chunked)
    outs = drive_to_end(Engine(model, cfg), prompts, params)
    assert [o.output_ids for o in outs] == expected


@pytest.mark.task("task2.allocate_free")
@pytest.mark.task("task2.slot_mapping")
@pytest.mark.task("task2.paged_attention")
@pytest.mark.task("task2.allocate_slots")
@pytest.mark.task("task2.schedule")
@pytest.mark.parametrize("block_size", [4, 16])
def test_small_pool_forces_preemption_without_changing_tokens(model, reference, block_size):
    prompts, params, expected = reference
    need = max(-(-(len(p) + 10) // block_size) for p in prompts)
    cfg = EngineConfig(num_blocks=need + 2, block_size=block_size, max_num_seqs=8, max_num_batched_tokens=64)
    outs = drive_to_end(Engine(model, cfg), prompts, params)
    assert [o.output_ids for o in outs] == expected
    assert sum(o.num_preemptions for o in outs) > 0, "the pool was meant to be too small for the batch"


@pytest.mark.task("task2.allocate_free")
@pytest.mark.task("task2.slot_mapping")
@pytest.mark.task("task2.paged_attention")
@pytest.mark.task("task2.allocate_slots")
@pytest.mark.task("task2.schedule")
def test_decodes_are_batched_with_a_prefill_chunk(model):
    """Continuous batching: while a long prompt prefills in chunks, the running decodes keep stepping."""
    engine = Engine(model, EngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=16))
    short = engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=20))
    engine.step()  # the short prompt prefills
    engine.add_request(list(range(100)), SamplingParams(max_new_tokens=2))
    batch = engine.scheduler.schedule()
    sizes = {s.seq_id: n for s, n in batch}
    assert sizes[short] == 1 and sum(sizes.values()) == 16  # one decode + a 15-token chunk


@pytest.mark.task("task2.allocate_free")
@pytest.mark.task("task2.slot_mapping")
@pytest.mark.task("task2.paged_attention")
@pytest.mark.task("task2.allocate_slots")
@pytest.mark.task("task2.schedule")
def test_blocks_grow_one_at_a_time(model):
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4))
    sid = engine.add_request([5] * 5, SamplingParams(max_new_tokens=8))
    seq = engine.seqs[sid]
    sizes = []
    while engine.has_unfinished():
        engine.step()
        sizes.append(len(seq.block_table))
        engine.check_invariants()
    # step k stores 4 + k tokens: ceil((4 + k) / 4) blocks; the 8th sample finishes it and frees everything
    assert sizes == [2, 2, 2, 2, 3, 3, 3, 0]


def test_sampled_outputs_match_step01_with_same_seed(model):
    prompts = ragged_prompts(3, seed=5, hi=30)
    params = [SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.9, seed=i) for i in range(3)]
    outs = Engine(model, EngineConfig(num_blocks=64, block_size=4)).generate(prompts, params)
    assert [o.output_ids for o in outs] == [generate(model, p, sp) for p, sp in zip(prompts, params)]


def test_abort_frees_blocks(model):
    engine = Engine(model, EngineConfig(num_blocks=16, block_size=4))
    sid = engine.add_request(list(range(20)), SamplingParams(max_new_tokens=5))
    engine.step()
    assert engine.cache_manager.block_manager.num_free < 16
    out = engine.abort(sid)
    assert out.aborted and engine.cache_manager.block_manager.num_free == 16 and not engine.has_unfinished()
    with pytest.raises(KeyError):
        engine.abort(sid)


def test_bad_input_is_rejected_with_nothing_queued(model):
    engine = Engine(model, EngineConfig(num_blocks=4, block_size=4, enable_chunked_prefill=False,
                                        max_num_batched_tokens=8))
    with pytest.raises(ValueError, match="pool has only 4"):
        engine.add_request(list(range(15)), SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="chunked prefill"):
        engine.add_request(list(range(8)), SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request([], SamplingParams())
    assert not engine.has_unfinished()
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(block_size=-4)


class ShortestFirst(Policy):
    """A policy for the tests: the shortest waiting prompt first; preempted sequences stay at the front."""

    name = "shortest-first"

    def __init__(self) -> None:
        self.seats: list[int] = []

    def order(self, waiting, cache_manager, seats: int) -> None:
        self.seats.append(seats)
        head = [s for s in waiting if s.num_preemptions]
        rest = sorted((s for s in waiting if not s.num_preemptions), key=lambda s: s.num_prompt_tokens)
        waiting.clear()
        waiting.extend(head + rest)


@pytest.mark.parametrize("policy", [None, ShortestFirst()], ids=["default", "shortest-first"])
def test_a_policy_orders_admission_without_changing_tokens(model, reference, policy):
    """The scheduler admits from the front of the queue as its policy ordered it (by default, FCFS: as they
    came); the policy asks when a seat is free and says how many are; the answers never change."""
    prompts, params, expected = reference
    engine = Engine(model, EngineConfig(num_blocks=512, block_size=4, max_num_seqs=2, max_num_batched_tokens=64),
                    policy=policy)
    outs = drive_to_end(engine, prompts, params)
    assert [o.output_ids for o in outs] == expected
    admitted = [seq_id for seq_id, _, _ in engine.cache_manager.stats.recent]
    if policy is None:
        assert isinstance(engine.scheduler.policy, FCFS) and admitted == sorted(admitted)
    else:
        assert admitted == sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        assert policy.seats and set(policy.seats) <= {1, 2}, "asked only with a free seat, told how many"


def test_waste_stays_under_one_block_per_sequence(model):
    engine = Engine(model, EngineConfig(num_blocks=256, block_size=16))
    prompts = ragged_prompts(5, seed=9, hi=120)
    engine.generate(prompts, SamplingParams(max_new_tokens=6))
    s = engine.stats
    unfilled_per_step = (s.allocated_slot_steps - s.filled_slot_steps) / s.steps
    assert 0 < s.waste_fraction < 1
    assert unfilled_per_step < 5 * 16  # at most one partly filled block per running sequence


@pytest.mark.slow
def test_real_model_engine_matches_step01(real_model, tokenizer):
    from step01_kvcache.demo import chat_ids

    prompts = [chat_ids(tokenizer, q, "You are a helpful assistant.") for q in
               ["What is 2+2?", "Name a famous painting by Leonardo da Vinci and describe it briefly.", "Hi"]]
    params = SamplingParams(max_new_tokens=16)
    outs = Engine(real_model, EngineConfig(num_blocks=64, block_size=16, max_num_batched_tokens=64)).generate(
        prompts, params)
    assert [o.output_ids for o in outs] == [generate(real_model, p, params) for p in prompts]
