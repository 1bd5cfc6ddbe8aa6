"""The textbook's cache in chapter 2's engine: cache on == cache off == step01, token for token, at block sizes 1,
3, 4 and 16, chunked or not, under memory pressure, with speculative decoding, on every course workload; its hits
equal the bridge's and chapter 3's hash at the same block size (granularity decides what is reused); and the
Hypothesis machine of the bridge with two more rules: eviction at any moment, and forwards that raise."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from course.workloads import WORKLOADS, get_workload, reusable_tokens
from step01_kvcache.generate import SamplingParams
from step01_kvcache.tiny import tiny_model
from step02_paged import Engine, EngineConfig, KVCacheManager
from step02_paged.forward_batch import ForwardBatch
from step02_paged.model_runner import ModelRunner
from step02_paged.paged_attention import PagedAttention
from step03_prefix_hash import PrefixCachingKVCacheManager
from step05_bridge import BridgeKVCacheManager, OffsetKVCacheManager, SpeculativeConfig, SpeculativeEngine
from tests.driver import (
    drive_to_end,
    engine_for,
    oracle,
    peak_blocks_off_and_on,
    run_twice_under_pressure,
    shared_prompts,
    speculation_reuses_only_verified,
)
from tests.machines import MODEL
from tests.step05 import test_engine as bridge_tests
from tests.step05.test_engine_machine import BridgeEngineMachine

model, reference, wide_model = bridge_tests.model, bridge_tests.reference, bridge_tests.wide_model  # its fixtures


def offset_engine(model, **kw) -> Engine:
    config = EngineConfig(**{"num_blocks": 256, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 32,
                             **kw})
    return Engine(model, config, OffsetKVCacheManager)


@pytest.mark.parametrize("bs", [1, 3, 4, 16])
@pytest.mark.parametrize("chunked", [True, False])
def test_cache_on_matches_step01_twice(model, reference, bs, chunked):
    prompts, params, expected = reference
    engine = offset_engine(model, block_size=bs, enable_chunked_prefill=chunked,
                           max_num_batched_tokens=32 if chunked else 256)
    for round_ in range(2):
        outs = drive_to_end(engine, prompts, params)
        assert [o.output_ids for o in outs] == expected, f"round {round_}"
    assert [o.num_cached_tokens for o in outs] == [(len(p) - 1) // bs * bs for p in prompts], \
        "round 2 hits every full block of the prompt but the last token"


@pytest.mark.parametrize("bs", [1, 4, 16])
def test_hits_equal_the_bridge_and_the_hash(model, bs):
    """Where the split falls changes no hit: on the same sequential requests the textbook's tree reuses exactly
    what the bridge and chapter 3's hash of full blocks reuse, and caches as many blocks as the bridge."""
    prompts = shared_prompts(12, seed=4) * 2
    params = SamplingParams(max_new_tokens=3)
    config = EngineConfig(num_blocks=256, block_size=bs, max_num_seqs=4, max_num_batched_tokens=32)
    engines = {name: Engine(model, config, manager) for name, manager in
               (("offset", OffsetKVCacheManager), ("bridge", BridgeKVCacheManager),
                ("hash", PrefixCachingKVCacheManager))}
    hits = {name: [drive_to_end(e, [p], params)[0].num_cached_tokens for p in prompts] for name, e in engines.items()}
    ideal = [min(r, len(p) - 1) // bs * bs for r, p in zip(reusable_tokens(prompts), prompts)]
    assert all(h == ideal for h in hits.values()), hits
    assert sum(ideal) > 0
    assert engines["offset"].cache_manager.num_cached_blocks == engines["bridge"].cache_manager.num_cached_blocks, \
        "and the trees hold the same blocks: the full blocks of every prompt"


def test_a_prefill_chunk_is_shared_before_its_request_finishes(model):
    engine = offset_engine(model, max_num_batched_tokens=16)
    stem = list(range(100, 148))
    engine.add_request(stem + [1, 2], SamplingParams(max_new_tokens=4))
    engine.step()
    engine.step()  # 32 tokens computed: 8 full blocks in the tree, locked
    assert engine.cache_manager.num_cached_blocks == 8 and engine.cache_manager.tree.protected_size == 8
    b = engine.add_request(stem + [9], SamplingParams(max_new_tokens=4))
    outs = {o.seq_id: o for o in drive_to_end(engine)}
    assert outs[b].num_cached_tokens == 48


def test_shared_prefix_is_held_once(model):
    prompts = [list(range(64)) + [200 + i] for i in range(4)]
    params = SamplingParams(max_new_tokens=3)
    peaks = peak_blocks_off_and_on(
        lambda on: Engine(model, EngineConfig(num_blocks=256, block_size=4, max_num_seqs=4,
                                              max_num_batched_tokens=256),
                          OffsetKVCacheManager if on else KVCacheManager), prompts, params)
    assert peaks[True] < peaks[False] / 2, peaks


@pytest.mark.parametrize("blocks", [24, 34])
def test_memory_pressure_evicts_and_preempts_without_changing_tokens(model, reference, blocks):
    outs = run_twice_under_pressure(offset_engine(model, num_blocks=blocks, max_num_seqs=4), reference)
    if blocks == 24:
        assert sum(o.num_preemptions for o in outs) > 0, "the pool was meant to force preemption"


@pytest.mark.parametrize("block_size,num_blocks", [(4, 256), (3, 40), (4, 24)], ids=["roomy", "odd", "tight"])
def test_speculation_inserts_only_verified_blocks(block_size, num_blocks):
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=4, max_num_batched_tokens=24)
    spec_model = tiny_model(seed=11)
    engine = SpeculativeEngine(spec_model, cfg, OffsetKVCacheManager, speculative=SpeculativeConfig(4))
    speculation_reuses_only_verified(engine, oracle(spec_model), shared_prompts(6, seed=5), 10,
                                     roomy=num_blocks >= 256)


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_workload_matches_the_bridge(wide_model, tokenizer, name):
    """Real tokens of every course workload, 16-token blocks: the same answers as the bridge, one request at a
    time and all at once, and every shared full block reused."""
    workload = get_workload(name)
    prompts = workload.prompts(tokenizer)
    every_round = prompts * workload.rounds
    params = SamplingParams(max_new_tokens=3)
    blocks = sum(len(p) + 3 for p in prompts) // 16 + 2 * len(prompts) + 8
    config = EngineConfig(num_blocks=blocks, block_size=16, max_num_seqs=8, max_num_batched_tokens=512)
    results = {}
    for manager in (BridgeKVCacheManager, OffsetKVCacheManager):
        engine = Engine(wide_model, config, manager)
        sequential = [drive_to_end(engine, [p], params)[0] for p in every_round]
        concurrent = drive_to_end(Engine(wide_model, config, manager), prompts, params)
        results[manager] = sequential, concurrent
    (seq_b, con_b), (seq_o, con_o) = results.values()
    assert [o.output_ids for o in seq_o] == [o.output_ids for o in seq_b]
    assert [o.output_ids for o in con_o] == [o.output_ids for o in con_b]
    ideal = [min(r, len(p) - 1) // 16 * 16 for r, p in zip(reusable_tokens(every_round), every_round)]
    assert [o.num_cached_tokens for o in seq_o] == ideal


# ---- the state machine --------------------------------------------------------------------------------------
class InjectedFault(RuntimeError):
    """What the machine's runner raises in place of a forward."""


class FaultyRunner(ModelRunner):
    """Chapter 2's runner, with a switch: the next forward raises, before the model runs or after it wrote the
    step's K/V (the engine moved no counter, so it computes them again)."""

    fault: str | None = None  # "before" or "after"

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        fault, self.fault = self.fault, None
        if fault == "before":
            raise InjectedFault(fault)
        logits = super().forward(batch)
        if fault == "after":
            raise InjectedFault(fault)
        return logits


class OffsetEngineMachine(BridgeEngineMachine):
    """The bridge's machine (submit, step, finish, abort, speculate) over the textbook's cache, at block size 4,
    with two more rules: an eviction of any size between steps, and a step whose forward raises."""

    def make_engine(self):
        return engine_for(MODEL, EngineConfig(num_blocks=self.num_blocks, block_size=self.block_size, max_num_seqs=3,
                                          max_num_batched_tokens=10), OffsetKVCacheManager,
                      PagedAttention, runner=FaultyRunner, **self.speculation)

    @rule(n=st.integers(1, 8))
    def evict(self, n):
        kv = self.engine.cache_manager
        before = kv.block_manager.num_free
        freed = kv.evict(n)
        assert kv.block_manager.num_free == before + freed, "an evicted block of an unlocked leaf is free at once"

    @precondition(lambda self: self.engine.has_unfinished())
    @rule(when=st.sampled_from(["before", "after"]))
    def fault(self, when):
        self.engine.runner.fault = when
        try:
            self.step()
        except InjectedFault:
            pass
        finally:
            self.engine.runner.fault = None


class OddBlockOffsetMachine(OffsetEngineMachine):
    block_size, num_blocks = 3, 16


TestOffsetEngineMachine = OffsetEngineMachine.TestCase
TestOffsetEngineMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestOddBlockOffsetMachine = OddBlockOffsetMachine.TestCase
TestOddBlockOffsetMachine.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)


def test_a_faulty_forward_changes_no_answer():
    """The machine's fault rule, once by hand: a step raises after the model ran, the next computes it again."""
    engine = Engine(MODEL, EngineConfig(num_blocks=32, block_size=4), OffsetKVCacheManager, runner=FaultyRunner)
    prompt = [random.Random(0).randrange(256) for _ in range(10)]
    engine.add_request(prompt, SamplingParams(max_new_tokens=4))
    engine.runner.fault = "after"
    with pytest.raises(InjectedFault):
        engine.step()
    engine.check_invariants()
    (out,) = drive_to_end(engine)
    assert out.output_ids == oracle(MODEL)(tuple(prompt), 4)


@pytest.mark.slow
def test_real_model_shared_prefix_hits_like_the_bridge_identical_and_clean(real_model, shared_prefix_off):
    """The mini-vllm tutorial's shared-prefix run on SmolLM2 with 16-token blocks, as the bridge's test runs it: round
    1 reuses the shared prefix's full blocks for 9 requests of 10, round 2 for all; the answers equal the cache-off
    engine's; afterwards no lock is held and the tree is the only holder of every cached block."""
    prompts, params = shared_prefix_off.prompts, shared_prefix_off.params
    engine = Engine(real_model, EngineConfig(num_blocks=160, block_size=16), OffsetKVCacheManager)
    rounds = [[drive_to_end(engine, [p], params)[0] for p in prompts] for _ in range(2)]
    assert [sum(o.num_cached_tokens > 0 for o in r) / len(r) for r in rounds] == [0.9, 1.0]
    assert [o.num_cached_tokens for o in rounds[1]] == [(len(p) - 1) // 16 * 16 for p in prompts]
    assert [o.output_ids for o in rounds[0]] == [o.output_ids for o in rounds[1]] == shared_prefix_off.outputs
    kv = engine.cache_manager
    assert kv.tree.protected_size == 0 and all(kv.block_manager.ref_count[b] == 1 for b in kv.tree.all_blocks())
