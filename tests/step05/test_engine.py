"""The bridge engine: cache on == cache off == step01, token for token, at block sizes 1, 3, 4 and 16, with
chunked prefill on and off and under memory pressure; its hits equal chapter 3's block hash at the same block
size and chapter 4's radix tree at block size 1; a drained engine holds no lock and leaks no block."""
from __future__ import annotations

import pytest

from course.workloads import WORKLOADS, get_workload, reusable_tokens
from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.tiny import tiny_model
from step02_paged import Engine, EngineConfig, KVCacheManager
from step02_paged.paged_attention import PagedAttention
from step03_prefix_hash import PrefixCachingKVCacheManager
from step04_radix import RadixKVCacheManager
from step05_bridge import BridgeKVCacheManager
from step05_bridge.pictures import bridge_dot
from tests.driver import (
    drive_to_end,
    peak_blocks_off_and_on,
    run_twice_under_pressure,
    shared_prompts,
    with_reference,
)
from tests.step05.stand_in import bridge_with


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5)


@pytest.fixture(scope="module")
def reference(model):
    return with_reference(model, shared_prompts(8, seed=2) + [[3], [3, 4]], new_tokens=8)


def bridge_engine(model, on: bool = True, manager: type = BridgeKVCacheManager, **kw) -> Engine:
    """Chapter 2's engine with the bridge, `manager` (or, off, chapter 2's manager)."""
    config = EngineConfig(**{"num_blocks": 256, "block_size": 4, "max_num_seqs": 4, "max_num_batched_tokens": 32,
                             **kw})
    return Engine(model, config, manager if on else KVCacheManager)


# The bridge as written runs span, insert and dedup together: its end-to-end tests carry all three markers and
# wait for their stubs; insert's own engine tests run the stand-in's span and dedup (stand_in.py).
BRIDGE_TASKS = [pytest.mark.task("task5.span"), pytest.mark.task("task5.insert"), pytest.mark.task("task5.dedup")]


@pytest.mark.parametrize("bs", [1, 3, 4, 16])
@pytest.mark.parametrize("on", [pytest.param(True, marks=BRIDGE_TASKS, id="on"), pytest.param(False, id="off")])
@pytest.mark.parametrize("chunked", [True, False])
def test_cache_on_and_off_match_step01_twice(model, reference, bs, on, chunked):
    prompts, params, expected = reference
    engine = bridge_engine(model, on=on, block_size=bs, enable_chunked_prefill=chunked,
                           max_num_batched_tokens=32 if chunked else 256)
    for round_ in range(2):
        outs = drive_to_end(engine, prompts, params)
        assert [o.output_ids for o in outs] == expected, f"round {round_}"
    if on:
        assert [o.num_cached_tokens for o in outs] == [(len(p) - 1) // bs * bs for p in prompts], \
            "round 2 hits every full block of the prompt but the last token"


@pytest.mark.parametrize("bs", [1, 4, 16])
def test_hits_equal_the_block_hash_at_the_same_block_size(model, bs):
    """Granularity, not the data structure, decides what is reused: on the same sequential requests the bridge
    hits exactly as many tokens as chapter 3's hash of full blocks, and at block_size 1 as chapter 4's tree."""
    prompts = shared_prompts(12, seed=4) * 2
    params = SamplingParams(max_new_tokens=3)
    config = EngineConfig(num_blocks=256, block_size=bs, max_num_seqs=4, max_num_batched_tokens=32)
    engines = {"bridge": Engine(model, config, BridgeKVCacheManager),
               "hash": Engine(model, config, PrefixCachingKVCacheManager)}
    if bs == 1:
        engines["radix"] = Engine(model, config, RadixKVCacheManager)
    hits = {name: [drive_to_end(e, [p], params)[0].num_cached_tokens for p in prompts] for name, e in engines.items()}
    ideal = [min(r, len(p) - 1) // bs * bs for r, p in zip(reusable_tokens(prompts), prompts)]
    assert all(h == ideal for h in hits.values()), hits
    assert sum(ideal) > 0


@pytest.mark.task("task5.insert")
def test_a_prefill_chunk_is_shared_before_its_request_finishes(model):
    engine = bridge_engine(model, manager=bridge_with("task5.insert"), max_num_batched_tokens=16)
    stem = list(range(100, 148))
    engine.add_request(stem + [1, 2], SamplingParams(max_new_tokens=4))
    engine.step()
    engine.step()  # a has computed 32 tokens: 8 full blocks in the tree, a locks them
    assert engine.cache_manager.num_cached_blocks == 8 and engine.cache_manager.tree.protected_size == 8
    b = engine.add_request(stem + [9], SamplingParams(max_new_tokens=4))
    outs = {o.seq_id: o for o in drive_to_end(engine)}
    assert outs[b].num_cached_tokens == 48, "b shares all 48 stem tokens (12 blocks) computed by a's chunks"
    assert outs[b].output_ids == generate(model, stem + [9], SamplingParams(max_new_tokens=4))


class CountingAttention(PagedAttention):
    """Chapter 2's attention, counting the steps it serves: a stand-in for any other backend."""

    steps = 0

    @classmethod
    def for_step(cls, *args) -> PagedAttention:
        cls.steps += 1
        return super().for_step(*args)


@pytest.mark.parametrize("manager",
                         [KVCacheManager, PrefixCachingKVCacheManager, RadixKVCacheManager, BridgeKVCacheManager])
def test_every_manager_runs_on_the_attention_it_is_given(model, reference, manager):
    """The engine's two seams are independent: any chapter's cache manager runs on any attention class."""
    prompts, params, expected = reference
    config = EngineConfig(num_blocks=1024, block_size=1 if manager is RadixKVCacheManager else 4)
    CountingAttention.steps = 0
    engine = Engine(model, config, manager, attention=CountingAttention)
    assert [o.output_ids for o in drive_to_end(engine, prompts, params)] == expected
    assert CountingAttention.steps == engine.stats.steps > 0


def test_shared_prefix_is_held_once(model):
    prompts = [list(range(64)) + [200 + i] for i in range(4)]
    params = SamplingParams(max_new_tokens=3)
    peaks = peak_blocks_off_and_on(
        lambda on: bridge_engine(model, on=on, max_num_batched_tokens=256), prompts, params)
    assert peaks[True] < peaks[False] / 2, peaks


@pytest.mark.parametrize("blocks", [pytest.param(n, marks=BRIDGE_TASKS) for n in (24, 34)])
def test_memory_pressure_evicts_and_preempts_without_changing_tokens(model, reference, blocks):
    outs = run_twice_under_pressure(bridge_engine(model, num_blocks=blocks, max_num_seqs=4), reference)
    if blocks == 24:
        assert sum(o.num_preemptions for o in outs) > 0, "the pool was meant to force preemption"


def test_bad_configuration_and_input_are_rejected(model):
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        EngineConfig(block_size=0)
    engine = bridge_engine(model, num_blocks=4)
    with pytest.raises(ValueError, match="pool has only 4"):
        engine.add_request(list(range(15)), SamplingParams(max_new_tokens=4))
    assert not engine.has_unfinished()
    assert type(bridge_engine(model, on=False).cache_manager) is KVCacheManager
    assert isinstance(engine.cache_manager, BridgeKVCacheManager)


def test_dot_shows_three_layers(model):
    engine = bridge_engine(model, num_blocks=16, max_num_batched_tokens=8)
    drive_to_end(engine, [list(range(10))], SamplingParams(max_new_tokens=2))
    assert '"b0" BGCOLOR="white">0<BR/>tree</TD><TD PORT="b1" BGCOLOR="white">1<BR/>tree</TD><TD PORT="b2" ' \
           'BGCOLOR="#cccccc">2<BR/>free' in bridge_dot(engine.cache_manager), "drained: blocks held by the tree alone"
    sid = engine.add_request(list(range(9)) + [99] * 6, SamplingParams(max_new_tokens=4))
    engine.step()
    dot = bridge_dot(engine.cache_manager)
    assert f'"seq{sid}" -> "n' in dot and "last_node" in dot and '"b0" BGCOLOR="#fde293">0<BR/>ref 2' in dot, dot
    assert '"n1" -> "pool":b0' in dot, "a node points at the blocks it owns"
    assert dot == bridge_dot(engine.cache_manager), "deterministic"


# ---- every course workload, tiny model, real tokens ---------------------------------------------------------
@pytest.fixture(scope="module")
def wide_model():
    return tiny_model(seed=7, vocab_size=49152, max_position_embeddings=4096, num_layers=1, hidden_size=32,
                      intermediate_size=32, head_dim=8)


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_workload_cache_on_equals_off(wide_model, tokenizer, name):
    workload = get_workload(name)
    prompts = workload.prompts(tokenizer)
    every_round = prompts * workload.rounds
    params = SamplingParams(max_new_tokens=3)
    blocks = sum(len(p) + 3 for p in prompts) // 16 + 2 * len(prompts) + 8
    results = {}
    for on in (False, True):
        engine = bridge_engine(wide_model, on=on, num_blocks=blocks, block_size=16, max_num_seqs=8,
                               max_num_batched_tokens=512)
        sequential = [drive_to_end(engine, [p], params)[0] for p in every_round]
        concurrent = drive_to_end(Engine(wide_model, engine.config, type(engine.cache_manager)), prompts, params)
        results[on] = sequential, concurrent
    (seq_off, con_off), (seq_on, con_on) = results[False], results[True]
    assert [o.output_ids for o in seq_on] == [o.output_ids for o in seq_off]
    assert [o.output_ids for o in con_on] == [o.output_ids for o in con_off]
    ideal = [min(r, len(p) - 1) // 16 * 16 for r, p in zip(reusable_tokens(every_round), every_round)]
    assert [o.num_cached_tokens for o in seq_on] == ideal, "every shared full block is reused"
