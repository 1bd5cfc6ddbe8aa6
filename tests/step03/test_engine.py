"""The prefix-caching engine gives exactly step01's tokens, cache on or off, with preemption and chunking,
and every drained engine holds no block. The engine runs the chapter's bodies as written: its tests carry the marker
of every task they run (end to end), and wait for the stubs of those still unsolved."""
from __future__ import annotations

import pytest

from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.tiny import tiny_model
from step02_paged import Engine, EngineConfig, PrefixMatch
from step02_paged.sequence import Sequence
from step03_prefix_hash import HashedSequence, PrefixCachingKVCacheManager
from step03_prefix_hash.pictures import hash_tree_dot, hash_tree_text
from tests.driver import drive_to_end

from .helpers import cached_engine, shared_prefix_prompts


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=11)


def reference(model, prompts, params):
    return [generate(model, p, params) for p in prompts]


@pytest.mark.task("task3.block_hash")
@pytest.mark.task("task3.free_queue")
@pytest.mark.task("task3.touch_evict")
@pytest.mark.task("task3.lookup")
@pytest.mark.task("task3.publish")
@pytest.mark.parametrize("block_size", [4, 16])
def test_cache_on_equals_off_with_preemption(model, block_size):
    prompts = shared_prefix_prompts(10, seed=block_size, block_size=block_size)
    params = SamplingParams(max_new_tokens=8)
    expected = reference(model, prompts, params)
    need = max(-(-(len(p) + 8) // block_size) for p in prompts)
    cfg = EngineConfig(num_blocks=need + 1, block_size=block_size, max_num_seqs=6, max_num_batched_tokens=24)
    on = drive_to_end(Engine(model, cfg, PrefixCachingKVCacheManager), prompts, params)
    off = drive_to_end(Engine(model, cfg), prompts, params)
    assert [o.output_ids for o in on] == [o.output_ids for o in off] == expected
    assert sum(o.num_preemptions for o in on) > 0, "the pool was meant to be too small for the batch"
    assert sum(o.num_cached_tokens for o in on) > 0 and sum(o.num_cached_tokens for o in off) == 0


@pytest.mark.task("task3.block_hash")
@pytest.mark.task("task3.free_queue")
@pytest.mark.task("task3.touch_evict")
@pytest.mark.task("task3.lookup")
@pytest.mark.task("task3.publish")
def test_sequential_requests_reuse_what_earlier_ones_computed(model):
    prompts = shared_prefix_prompts(8, seed=3)
    params = SamplingParams(max_new_tokens=5)
    engine = cached_engine(model, num_blocks=64, block_size=4)
    outs = [drive_to_end(engine, [p], params)[0] for p in prompts]
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


@pytest.mark.task("task3.block_hash")
@pytest.mark.task("task3.free_queue")
@pytest.mark.task("task3.touch_evict")
@pytest.mark.task("task3.lookup")
@pytest.mark.task("task3.publish")
def test_generated_tokens_become_a_reusable_prefix(model):
    """A chat's next turn starts with the previous turn's prompt and answer: the answer's blocks, filled
    during decode, are hits."""
    engine = cached_engine(model, num_blocks=32, block_size=4)
    first = list(range(30, 36))
    [out] = drive_to_end(engine, [first], SamplingParams(max_new_tokens=9))
    turn2 = first + out.output_ids + [7, 8]
    [out2] = drive_to_end(engine, [turn2], SamplingParams(max_new_tokens=3))
    assert out2.num_cached_tokens == 12, "6 prompt + 8 computed answer tokens = 3 full blocks (the 9th has no K/V)"
    assert out2.output_ids == generate(model, turn2, SamplingParams(max_new_tokens=3))


@pytest.mark.task("task3.block_hash")
@pytest.mark.task("task3.free_queue")
@pytest.mark.task("task3.touch_evict")
@pytest.mark.task("task3.lookup")
@pytest.mark.task("task3.publish")
def test_full_hit_prompt_runs_one_token_and_matches(model):
    engine = cached_engine(model, num_blocks=32, block_size=4)
    prompt = list(range(12))
    params = SamplingParams(max_new_tokens=4)
    a = drive_to_end(engine, [prompt], params)[0]
    b = drive_to_end(engine, [prompt], params)[0]
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 8)
    assert a.output_ids == b.output_ids == generate(model, prompt, params)


def test_concurrent_requests_share_blocks(model):
    engine = cached_engine(model, num_blocks=32, block_size=4)
    drive_to_end(engine, [list(range(20))], SamplingParams(max_new_tokens=2))
    ids = [engine.add_request(list(range(16)) + [100 + i], SamplingParams(max_new_tokens=3)) for i in range(2)]
    engine.step()
    tables = [engine.seqs[i].block_table for i in ids]
    assert tables[0][:4] == tables[1][:4]
    assert [engine.cache_manager.block_manager.ref_count[b] for b in tables[0][:4]] == [2, 2, 2, 2]
    engine.check_invariants()
    drive_to_end(engine)


def test_salts_isolate_requests(model):
    engine = cached_engine(model, num_blocks=32, block_size=4)
    prompt, params = list(range(9)), SamplingParams(max_new_tokens=2)
    outs = [drive_to_end(engine, [prompt], params, cache_salt=salt)[0] for salt in ["a", "b", "a", None]]
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
    on = [drive_to_end(Engine(model, cfg, PrefixCachingKVCacheManager), prompts, params),
          drive_to_end(Engine(model, cfg), prompts, params)]
    assert [o.output_ids for o in on[0]] == [o.output_ids for o in on[1]] == [
        generate(model, p, sp) for p, sp in zip(prompts, params)]


def test_reset_only_when_idle(model):
    engine = cached_engine(model, num_blocks=16, block_size=4)
    drive_to_end(engine, [list(range(9))], SamplingParams(max_new_tokens=2))
    sid = engine.add_request(list(range(9)), SamplingParams(max_new_tokens=4))
    engine.step()
    with pytest.raises(RuntimeError, match="finish or abort"):
        engine.cache_manager.reset_cache()
    engine.check_invariants()
    assert engine.abort(sid).aborted
    assert engine.cache_manager.reset_cache() > 0
    [out] = drive_to_end(engine, [list(range(9))], SamplingParams(max_new_tokens=2))
    assert out.num_cached_tokens == 0


def test_abort_keeps_computed_blocks_cached(model):
    engine = cached_engine(model, num_blocks=16, block_size=4)
    sid = engine.add_request(list(range(10)), SamplingParams(max_new_tokens=5))
    engine.step()
    engine.abort(sid)
    engine.check_invariants()  # drained: every block free (cached ones in the LRU queue)
    assert engine.cache_manager.block_manager.num_cached == 2
    [out] = drive_to_end(engine, [list(range(10))], SamplingParams(max_new_tokens=2))
    assert out.num_cached_tokens == 8


def test_cache_off_is_chapter2s_manager_and_plain_sequences(model):
    off = Engine(model, EngineConfig(num_blocks=8, block_size=4))
    sid = off.add_request([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=2))
    assert type(off.seqs[sid]) is Sequence, "no hashing when the cache is off"
    engine = cached_engine(model, num_blocks=8, block_size=4)
    sid = engine.add_request([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=2))
    assert isinstance(engine.seqs[sid], HashedSequence)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request([])


def test_a_stale_match_is_refused_and_changes_nothing(model):
    """The scheduler may look up several waiting requests before it allocates: another admission can evict a
    matched block in between. Allocating with the old match must fail loudly, not share someone else's K/V."""
    engine = cached_engine(model, num_blocks=4, block_size=4)
    drive_to_end(engine, [list(range(9))], SamplingParams(max_new_tokens=1))  # blocks 0, 1 cached and free
    kv = engine.cache_manager
    a = kv.new_sequence(10, list(range(9)), SamplingParams(max_new_tokens=1))
    match = kv.get_computed_blocks(a)
    assert match.num_tokens == 8
    b = kv.new_sequence(11, [200] * 16, SamplingParams(max_new_tokens=1))
    assert kv.allocate_slots(b, 16, kv.get_computed_blocks(b))  # takes all 4 blocks: a's hits are evicted
    before = (list(kv.block_manager.ref_count), dict(kv.holders))
    with pytest.raises(ValueError, match="stale match"):
        kv.allocate_slots(a, 1, match)
    assert (list(kv.block_manager.ref_count), dict(kv.holders)) == before and a.block_table == []
    with pytest.raises(ValueError, match="only on admission"):
        kv.allocate_slots(b, 1, PrefixMatch((0,), 4))
    kv.free(b)
    kv.check_invariants()


def test_pictures_are_deterministic(model):
    def run():
        engine = cached_engine(model, num_blocks=24, block_size=4)
        for p in ([1] * 9, [1] * 8 + [2] * 5, [3] * 6):
            drive_to_end(engine, [p], SamplingParams(max_new_tokens=2))
        engine.add_request([1] * 8 + [4], SamplingParams(max_new_tokens=2))
        engine.step()
        return engine
    a, b = run(), run()
    dot = hash_tree_dot(a.cache_manager, decode=lambda ids: " ".join(map(str, ids)))
    assert dot == hash_tree_dot(b.cache_manager, decode=lambda ids: " ".join(map(str, ids)))
    assert dot.count('"root" -> ') == 2, "two first blocks: [1 1 1 1] and [3 3 3 3]"
    assert '"seq3"' in dot and "LRU free queue" in dot
    text = hash_tree_text(a.cache_manager)
    assert text == hash_tree_text(b.cache_manager) and text.startswith("root") and "ref 1" in text
