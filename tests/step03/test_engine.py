"""The prefix-caching engine gives exactly step01's tokens, cache on or off, with preemption and chunking,
and every drained engine holds no block."""
from __future__ import annotations

import pytest

from course.tiny import tiny_model
from step01_kvcache.generate import SamplingParams, generate
from step02_paged import EngineConfig as PagedConfig
from step02_paged.sequence import Sequence
from step03_prefix_hash import Engine, EngineConfig, HashedSequence

from .helpers import assert_drained, run_checked, shared_prefix_prompts


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=11)


def reference(model, prompts, params):
    return [generate(model, p, params) for p in prompts]


@pytest.mark.task("task3.lookup")
@pytest.mark.parametrize("block_size", [4, 16])
def test_cache_on_equals_off_with_preemption(model, block_size):
    prompts = shared_prefix_prompts(10, seed=block_size, block_size=block_size)
    params = SamplingParams(max_new_tokens=8)
    expected = reference(model, prompts, params)
    need = max(-(-(len(p) + 8) // block_size) for p in prompts)
    cfg = EngineConfig(num_blocks=need + 1, block_size=block_size, max_num_seqs=6, max_num_batched_tokens=24)
    on = run_checked(Engine(model, cfg), prompts, params)
    off = run_checked(Engine(model, cfg, prefix_caching=False), prompts, params)
    assert [o.output_ids for o in on] == [o.output_ids for o in off] == expected
    assert sum(o.num_preemptions for o in on) > 0, "the pool was meant to be too small for the batch"
    assert sum(o.num_cached_tokens for o in on) > 0 and sum(o.num_cached_tokens for o in off) == 0


@pytest.mark.task("task3.publish")
def test_sequential_requests_reuse_what_earlier_ones_computed(model):
    prompts = shared_prefix_prompts(8, seed=3)
    params = SamplingParams(max_new_tokens=5)
    engine = Engine(model, EngineConfig(num_blocks=64, block_size=4))
    outs = [run_checked(engine, [p], params)[0] for p in prompts]
    assert [o.output_ids for o in outs] == reference(model, prompts, params)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        # an ideal block cache: the longest whole-block prefix shared with any earlier prompt + its output
        best = max((_lcp(p, q + r.output_ids[:-1]) for q, r in zip(prompts[:i], outs[:i])), default=0)
        assert o.num_cached_tokens == min(best, len(p) - 1) // 4 * 4, f"request {i}"
        assert o.ttft_s > 0


def _lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.task("task3.publish")
def test_generated_tokens_become_a_reusable_prefix(model):
    """A chat's next turn starts with the previous turn's prompt and answer: the answer's blocks, filled
    during decode, are hits."""
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4))
    first = list(range(30, 36))
    [out] = run_checked(engine, [first], SamplingParams(max_new_tokens=9))
    turn2 = first + out.output_ids + [7, 8]
    [out2] = run_checked(engine, [turn2], SamplingParams(max_new_tokens=3))
    assert out2.num_cached_tokens == 12, "6 prompt + 8 computed answer tokens = 3 full blocks (the 9th has no K/V)"
    assert out2.output_ids == generate(model, turn2, SamplingParams(max_new_tokens=3))


@pytest.mark.task("task3.lookup")
def test_full_hit_prompt_runs_one_token_and_matches(model):
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4))
    prompt = list(range(12))
    params = SamplingParams(max_new_tokens=4)
    a = run_checked(engine, [prompt], params)[0]
    b = run_checked(engine, [prompt], params)[0]
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 8)
    assert a.output_ids == b.output_ids == generate(model, prompt, params)


def test_concurrent_requests_share_blocks(model):
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4))
    run_checked(engine, [list(range(20))], SamplingParams(max_new_tokens=2))
    ids = [engine.add_request(list(range(16)) + [100 + i], SamplingParams(max_new_tokens=3)) for i in range(2)]
    engine.step()
    tables = [engine.seqs[i].block_table for i in ids]
    assert tables[0][:4] == tables[1][:4]
    assert [engine.kv.block_manager.ref_count[b] for b in tables[0][:4]] == [2, 2, 2, 2]
    engine.check_invariants()
    while engine.has_unfinished():
        engine.step()
    assert_drained(engine)


def test_salts_isolate_requests(model):
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4))
    prompt, params = list(range(9)), SamplingParams(max_new_tokens=2)
    outs = [run_checked(engine, [prompt], params, salts=[salt])[0] for salt in ["a", "b", "a", None]]
    [a1, b, a2, none] = outs
    assert a1.num_cached_tokens == 0 and b.num_cached_tokens == 0 and none.num_cached_tokens == 0
    assert a2.num_cached_tokens == 8
    assert len({tuple(o.output_ids) for o in outs}) == 1
    with pytest.raises(ValueError, match="cache_salt"):
        engine.add_request(prompt, params, cache_salt=3)


def test_sampled_outputs_identical_with_cache_on_and_off(model):
    prompts = shared_prefix_prompts(5, seed=8)
    params = [SamplingParams(max_new_tokens=6, temperature=0.8, top_p=0.9, seed=i) for i in range(5)]
    cfg = EngineConfig(num_blocks=64, block_size=4)
    on = [run_checked(Engine(model, cfg), prompts, params), run_checked(Engine(model, cfg, False), prompts, params)]
    assert [o.output_ids for o in on[0]] == [o.output_ids for o in on[1]] == [
        generate(model, p, sp) for p, sp in zip(prompts, params)]


def test_reset_only_when_idle(model):
    engine = Engine(model, EngineConfig(num_blocks=16, block_size=4))
    run_checked(engine, [list(range(9))], SamplingParams(max_new_tokens=2))
    sid = engine.add_request(list(range(9)), SamplingParams(max_new_tokens=4))
    engine.step()
    with pytest.raises(RuntimeError, match="finish or abort"):
        engine.reset_prefix_cache()
    engine.check_invariants()
    assert engine.abort(sid).aborted
    assert engine.reset_prefix_cache() > 0
    [out] = run_checked(engine, [list(range(9))], SamplingParams(max_new_tokens=2))
    assert out.num_cached_tokens == 0


def test_abort_keeps_computed_blocks_cached(model):
    engine = Engine(model, EngineConfig(num_blocks=16, block_size=4))
    sid = engine.add_request(list(range(10)), SamplingParams(max_new_tokens=5))
    engine.step()
    engine.abort(sid)
    assert_drained(engine)
    assert engine.kv.block_manager.num_cached == 2
    [out] = run_checked(engine, [list(range(10))], SamplingParams(max_new_tokens=2))
    assert out.num_cached_tokens == 8


def test_config_and_flag(model):
    engine = Engine(model, PagedConfig(num_blocks=8, block_size=4))
    assert engine.prefix_caching and isinstance(engine.config, EngineConfig)
    off = Engine(model, EngineConfig(num_blocks=8, block_size=4), prefix_caching=False)
    assert not off.prefix_caching and not off.config.enable_prefix_caching
    sid = off.add_request([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=2))
    assert type(off.seqs[sid]) is Sequence, "no hashing when the cache is off"
    sid = engine.add_request([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=2))
    assert isinstance(engine.seqs[sid], HashedSequence)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request([])


def test_pictures_are_deterministic(model):
    def run():
        engine = Engine(model, EngineConfig(num_blocks=24, block_size=4))
        for p in ([1] * 9, [1] * 8 + [2] * 5, [3] * 6):
            run_checked(engine, [p], SamplingParams(max_new_tokens=2))
        engine.add_request([1] * 8 + [4], SamplingParams(max_new_tokens=2))
        engine.step()
        return engine
    a, b = run(), run()
    dot = a.kv.to_dot(decode=lambda ids: " ".join(map(str, ids)))
    assert dot == b.kv.to_dot(decode=lambda ids: " ".join(map(str, ids)))
    assert dot.count('"root" -> ') == 2, "two first blocks: [1 1 1 1] and [3 3 3 3]"
    assert '"seq3"' in dot and "LRU free queue" in dot
    text = a.kv.to_text()
    assert text == b.kv.to_text() and text.startswith("root") and "ref 1" in text
