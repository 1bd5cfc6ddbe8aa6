"""Chapter 5's SpeculativeEngine over chapter 2's paging: prompt lookup proposes, one forward verifies 1 + k tokens,
the rejected drafts are rolled back (`rollback`) and their blocks given back (`release_rejected_blocks`); answers never
change (greedy, and seeded sampling too), with chunked prefill, preemption and aborts in the mix."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.tiny import tiny_model
from step02_paged import EngineConfig, KVCacheManager
from step02_paged.geometry import PoolGeometry
from step02_paged.sequence import Sequence
from step05_bridge import SpeculativeConfig, SpeculativeEngine
from step05_bridge.ngram_proposer import NgramProposer
from step05_bridge.rollback import release_rejected_blocks, rollback
from tests.driver import drive_to_end, oracle, speculative_engine

MODEL = tiny_model(seed=11)
ROLLBACK = [pytest.mark.task("task5.rollback")]
answer = oracle(MODEL)


def small(k: int, num_blocks: int = 64, **lookup) -> SpeculativeEngine:
    """A speculative engine over a pool of 4-token blocks, verifying k guesses a step."""
    return SpeculativeEngine(MODEL, EngineConfig(num_blocks=num_blocks, block_size=4),
                             speculative=SpeculativeConfig(k, **lookup))


def prompts(n: int, seed: int, hi: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(1, hi))] for _ in range(n)]


# ---------------------------------------------------------------- the proposer


def naive_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """What prompt lookup proposes, by brute force: the longest suffix (max_n .. min_n tokens) that occurs earlier,
    its most recent earlier occurrence, and the k tokens after it."""
    for n in range(max_n, min_n - 1, -1):
        if n > len(tokens):
            continue
        suffix = tokens[len(tokens) - n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start: start + n] == suffix:
                return tokens[start + n: start + n + k]
    return []


def test_prompt_lookup_proposes_what_followed_the_longest_most_recent_match():
    proposer = NgramProposer(min_n=2, max_n=4)
    # [1, 2, 3, 4] occurs earlier (ending at 3) and so does [3, 4], more recently (ending at 7): the longer wins
    seq = Sequence(0, [1, 2, 3, 4, 9, 5, 3, 4, 8, 1, 2, 3, 4], SamplingParams())
    assert proposer.propose(seq, 3) == [9, 5, 3]
    assert proposer.propose(seq, 0) == []
    seq.append_token(6)  # no suffix of [..., 4, 6] occurs earlier: no draft
    assert proposer.propose(seq, 4) == []
    # among occurrences of the same length, the most recent: [3, 4] ended at 1 and at 4
    other = Sequence(1, [3, 4, 1, 3, 4, 2, 3, 4], SamplingParams())
    assert proposer.propose(other, 3) == [2, 3, 4]
    proposer.drop(0)
    assert proposer.tracked() == {1}


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=1, max_size=40), cuts=st.lists(st.integers(1, 40), max_size=4),
       k=st.integers(0, 5), sizes=st.sampled_from([(1, 1), (1, 3), (2, 4), (3, 3)]))
def test_the_index_answers_what_a_scan_of_the_whole_sequence_answers(tokens, cuts, k, sizes):
    """Tokens arrive in pieces; after each, the incremental index proposes what a full scan finds."""
    min_n, max_n = sizes
    proposer = NgramProposer(min_n, max_n)
    seq = Sequence(0, tokens[:1], SamplingParams(max_new_tokens=100))
    for cut in sorted(set(cuts)) + [len(tokens)]:
        for t in tokens[seq.num_tokens: cut]:
            seq.append_token(t)
        assert proposer.propose(seq, k) == naive_lookup(seq.all_token_ids, k, min_n, max_n)


def test_bad_speculation_settings_are_refused():
    for bad in (-1, 0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            SpeculativeConfig(num_speculative_tokens=bad)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_min=0)
    with pytest.raises(ValueError, match="prompt_lookup_max"):
        SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_min=3, prompt_lookup_max=2)
    with pytest.raises(TypeError, match="SpeculativeConfig"):
        SpeculativeEngine(MODEL, EngineConfig(), speculative=2)
    with pytest.raises(TypeError, match="speculative"):
        SpeculativeEngine(MODEL, EngineConfig())  # no default: a speculative engine is asked for its guesses
    assert not hasattr(EngineConfig(), "num_speculative_tokens"), "chapter 2's config knows nothing of guesses"


# ---------------------------------------------------------------- the rollback


def decoding(kv, computed: int, drafts: int) -> Sequence:
    """A sequence of `computed` + 1 tokens whose first `computed` are in the pool, with `drafts` drafts scheduled
    after its pending token, as a verify step's forward leaves it (its counter advanced over all of them)."""
    seq = kv.new_sequence(0, list(range(computed + 1)), SamplingParams(max_new_tokens=16))
    seq.spec_token_ids = [99] * drafts
    assert kv.allocate_slots(seq, computed)
    seq.admit(0)
    seq.advance(computed)
    assert kv.allocate_slots(seq, seq.num_pending_tokens)
    seq.advance(seq.num_pending_tokens)
    seq.spec_token_ids = []
    return seq


@pytest.mark.task("task5.rollback")
def test_a_rollback_across_a_block_boundary_gives_the_block_back():
    """Block size 4: 6 tokens computed, the pending token at position 6 and 4 drafts at 7-10 fill three blocks. The
    model rejects every draft: the third block held only drafts (8-10) and goes back to the free list; the second
    keeps position 7, where the token the model sampled instead (the bonus) is written next step."""
    kv = KVCacheManager(PoolGeometry(6, 4))
    seq = decoding(kv, computed=6, drafts=4)
    table = list(seq.block_table)
    assert len(table) == 3 and seq.num_computed_tokens == 11
    seq.synced_blocks = 3  # as if the engine had copied the row
    rollback(seq, 4)
    release_rejected_blocks(kv, seq)
    assert seq.num_computed_tokens == 7 and seq.block_table == table[:2]
    assert kv.block_manager.ref_count[table[2]] == 0 and kv.block_manager.free_blocks[-1] == table[2]
    assert seq.synced_blocks == 2, "the row is rewritten from the cut on when the table grows again"
    seq.append_token(5)  # the bonus token: 8 tokens, 7 computed, in 2 blocks
    kv.check_invariants()
    seq.check_invariants()


@pytest.mark.task("task5.rollback")
def test_a_rollback_inside_a_block_keeps_the_block():
    kv = KVCacheManager(PoolGeometry(6, 4))
    seq = decoding(kv, computed=4, drafts=2)  # pending token at 4, drafts at 5, 6: all in the second block
    rollback(seq, 2)
    release_rejected_blocks(kv, seq)
    assert seq.num_computed_tokens == 5 and len(seq.block_table) == 2 and kv.block_manager.num_free == 4


@pytest.mark.task("task5.rollback")
def test_a_rollback_past_the_drafts_is_refused():
    kv = KVCacheManager(PoolGeometry(6, 4))
    seq = decoding(kv, computed=5, drafts=2)
    for bad in (-1, 3, 2.0):
        with pytest.raises(ValueError):
            rollback(seq, bad)
    assert seq.num_computed_tokens == 8, "a refused rollback changes nothing"
    rollback(seq, 2)
    with pytest.raises(ValueError):
        rollback(seq, 1)  # the drafts are rolled back already: the verified tokens stay computed


# ---------------------------------------------------------------- the engine


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("good,bad", [  # with every draft accepted nothing is rolled back: no rollback to grade
    pytest.param(0, 3, marks=ROLLBACK, id="all-rejected"), pytest.param(2, 1, marks=ROLLBACK, id="some"),
    pytest.param(5, 0, id="all-accepted")])
def test_speculation_keeps_greedy_answers(block_size, chunked, good, bad):
    ps = prompts(5, seed=2) + [[7], [3, 3, 3, 3]]
    params = SamplingParams(max_new_tokens=12)
    cfg = EngineConfig(num_blocks=1024 // block_size, block_size=block_size, max_num_seqs=4,
                       max_num_batched_tokens=24 if chunked else 64, enable_chunked_prefill=chunked)
    engine = speculative_engine(SpeculativeEngine(MODEL, cfg, speculative=SpeculativeConfig(5)), answer, good, bad)
    outs = drive_to_end(engine, ps, params)
    assert [o.output_ids for o in outs] == [answer(tuple(p), 12) for p in ps]
    s = engine.stats
    assert s.draft_tokens > 0 and (s.accepted_tokens > 0) == (good > 0)
    if bad == 0:
        assert s.accepted_tokens == s.draft_tokens
    else:  # verification must reject the wrong drafts, not keep everything
        assert s.accepted_tokens < s.draft_tokens
    if good == 5:  # every draft right: far fewer steps than one token per step
        assert s.steps < sum(len(p) for p in ps) // 24 + 12


@pytest.mark.task("task5.rollback")
@pytest.mark.parametrize("block_size", [1, 4])
def test_speculation_under_preemption_keeps_greedy_answers(block_size):
    """A pool too small for the batch: sequences are preempted with drafts (dropped, recomputed later)."""
    ps = prompts(6, seed=3, hi=30)
    need = max(-(-(len(p) + 12) // block_size) for p in ps)
    cfg = EngineConfig(num_blocks=need + 2, block_size=block_size, max_num_seqs=6, max_num_batched_tokens=40)
    engine = speculative_engine(SpeculativeEngine(MODEL, cfg, speculative=SpeculativeConfig(4)), answer, good=1, bad=2)
    outs = drive_to_end(engine, ps, SamplingParams(max_new_tokens=12))
    assert [o.output_ids for o in outs] == [answer(tuple(p), 12) for p in ps]
    assert sum(o.num_preemptions for o in outs) > 0, "the pool was meant to be too small for the batch"


def test_an_abort_with_drafts_frees_everything():
    engine = speculative_engine(small(3, num_blocks=16),
                                answer, good=1, bad=2)
    sid = engine.add_request(list(range(9)), SamplingParams(max_new_tokens=10))
    engine.step()
    engine.step()
    assert engine.seqs[sid].spec_token_ids, "the sequence was meant to hold drafts"
    engine.abort(sid)
    engine.check_invariants()
    assert engine.cache_manager.block_manager.num_free == 16 and not engine.proposer.tracked()


def test_seeded_sampling_keeps_its_answers():
    """Sampled requests draw once per kept token, in order: the same generator stream as without speculation."""
    ps = prompts(4, seed=5, hi=30)
    params = [SamplingParams(max_new_tokens=10, temperature=0.8, top_p=0.9, seed=i) for i in range(4)]
    sampled = {tuple(p): generate(MODEL, p, sp) for p, sp in zip(ps, params)}
    engine = speculative_engine(small(3),
                                lambda prompt, new: sampled[prompt], good=2, bad=1)
    outs = engine.generate(ps, params)
    assert [o.output_ids for o in outs] == list(sampled.values())
    s = engine.stats
    assert 0 < s.accepted_tokens < s.draft_tokens, "drafts of the sampled answer were meant to be kept, the rest not"


def test_prompt_lookup_on_a_repetitive_answer():
    """The real proposer, end to end: a prompt that repeats itself gets drafts, and the answer does not change."""
    ps = [[5, 6, 7, 8] * 8, [1, 2, 3] * 9 + [4]]
    params = SamplingParams(max_new_tokens=16)
    engine = small(4, prompt_lookup_min=1)
    outs = drive_to_end(engine, ps, params)
    assert [o.output_ids for o in outs] == [answer(tuple(p), 16) for p in ps]
    assert engine.stats.draft_tokens > 0


def test_stop_tokens_end_a_verify_step():
    """A kept token that is a stop token ends the answer there, even when the drafts after it agree."""
    p = prompts(1, seed=7)[0]
    full = answer(tuple(p), 12)
    stop = full[4]
    expected = generate(MODEL, p, SamplingParams(max_new_tokens=12, stop_token_ids=(stop,)))
    engine = speculative_engine(small(6),
                                answer, good=6, bad=0)
    out = drive_to_end(engine, [p], SamplingParams(max_new_tokens=12, stop_token_ids=(stop,)))[0]
    assert out.output_ids == expected and out.output_ids[-1] == stop


@pytest.mark.slow
def test_real_model_copies_with_speculation(real_model, tokenizer):
    """SmolLM2 asked to repeat a sentence: prompt lookup drafts the copy, most drafts are accepted, same tokens."""
    from course.chat import chat_ids

    text = ("The lighthouse on Corrow Point was automated in the spring, and the keeper was told he could stay in "
            "the cottage until the end of the summer.")
    ids = chat_ids(tokenizer, f"Repeat this sentence exactly:\n\n{text}")
    params = SamplingParams(max_new_tokens=24)
    engine = SpeculativeEngine(real_model, EngineConfig(num_blocks=64, block_size=16), speculative=SpeculativeConfig(4))
    out = engine.generate([ids], params)[0]
    assert out.output_ids == generate(real_model, ids, params)
    assert engine.stats.acceptance_rate > 0.5 and engine.stats.steps < 16


def test_verify_step_cost_runs_on_the_cpu():
    """The GPU's measurement, in miniature: a verify step of 1 + k tokens against a decode step, per batch size."""
    from benchmarks.step05.speculative import verify_step_cost

    cost = verify_step_cost(MODEL, ks=(1, 3), batch_sizes=(1, 2), context=12, repeats=1)
    assert cost["device"] == "cpu" and cost["context"] == 12 and set(cost["batches"]) == {1, 2}
    for row in cost["batches"].values():
        assert row["decode_ms"] > 0 and set(row["verify_ms"]) == set(row["ratio"]) == {1, 3}


def test_speculative_bench_compares_the_same_answers(tokenizer):
    """The speculative bench on a tiny model with SmolLM2's vocabulary: plain, speculative and nothing-proposed runs
    of the same requests give the same tokens, and every figure the report reads is there. The layers' outputs are
    scaled down so that the model mostly repeats its last token: prompt lookup then drafts, and some drafts fail."""
    from benchmarks.step05.speculative import spec_bench

    model = tiny_model(seed=0, vocab_size=tokenizer.vocab_size, max_position_embeddings=1024)
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.o_proj.weight.mul_(0.05)
            layer.mlp.down_proj.weight.mul_(0.05)
    f = spec_bench(model, tokenizer, batches=(2,), max_new_tokens=16, repeats=1, workloads=("short",), cost_ks=(1,),
                   cost_context=8)
    [row] = f["rows"]
    assert row["outputs_identical"] and row["workload"] == "short" and row["batch"] == 2
    assert row["drafts_per_step"] > 0 and 0 < row["acceptance_rate"] < 1, "drafts proposed, verified, some rejected"
    assert row["nothing_proposed_speedup"] > 0
    assert set(f["verify_cost"]["batches"]) == {2}
