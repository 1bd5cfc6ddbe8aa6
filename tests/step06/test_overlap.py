"""Overlap scheduling (`OverlapEngine`, chapter 6): step N+1 is scheduled and launched before step N's tokens are
read. On the CPU (torch backend) nothing really overlaps, but everything else is the real thing — placeholders,
one-step-late finishes, dropped extra tokens — so the overlapped engine must give the synchronous engine's
tokens, request by request, on every cache design, through chunked prefill, preemption, sampling and aborts."""
from __future__ import annotations

import pytest
from hypothesis import settings

from step01_kvcache.request import SamplingParams
from step01_kvcache.tiny import tiny_model
from step02_paged import Engine, EngineConfig
from step02_paged.forward_batch import decodes_first
from step06_triton.engine import PREFIX_CACHES
from step06_triton.overlap import OverlapEngine
from tests.driver import drive_to_end, shared_prompts
from tests.machines import MODEL, EngineMachine

BLOCK = {"none": 4, "hash": 4, "radix": 1, "bridge": 4, "offset": 4}


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


def mixed_params(n: int) -> list[SamplingParams]:
    """Greedy and seeded sampled requests, some with a stop token that ends them early."""
    return [SamplingParams(max_new_tokens=5 + i % 4, temperature=0.0 if i % 2 else 0.8, top_p=0.9, seed=i,
                           stop_token_ids=(7, 11) if i % 3 == 0 else ()) for i in range(n)]


def engine(model, design: str, overlap: bool, tokens: int) -> Engine:
    bs = BLOCK[design]
    return (OverlapEngine if overlap else Engine)(model, EngineConfig(num_blocks=tokens // bs, block_size=bs,
                                                                      max_num_seqs=4, max_num_batched_tokens=16),
                                                  PREFIX_CACHES[design])


@pytest.mark.parametrize("design", sorted(BLOCK))
def test_overlap_gives_the_synchronous_tokens(model, design):
    prompts, params = shared_prompts(9, seed=5, stem=40), mixed_params(9)
    outs = {}
    for overlap in (False, True):
        e = engine(model, design, overlap, tokens=96)  # too small for four requests at once: preemption
        outs[overlap] = drive_to_end(e, prompts + prompts[:3], params + params[:3])
    assert [o.output_ids for o in outs[True]] == [o.output_ids for o in outs[False]]
    assert sum(o.num_preemptions for o in outs[True]) > 0, "the pool was meant to force preemption"
    if design != "none":
        assert sum(o.num_cached_tokens for o in outs[True]) > 0, "the repeated prompts were meant to hit"


@pytest.mark.parametrize("design", sorted(BLOCK))
def test_aborts_under_overlap_leave_the_other_answers_alone(model, design):
    prompts, params = shared_prompts(8, seed=9, stem=30), mixed_params(8)
    answers = {}
    for overlap in (False, True):
        e = engine(model, design, overlap, tokens=400)
        ids = [e.add_request(p, sp) for p, sp in zip(prompts, params)]
        done, step = {}, 0
        while e.has_unfinished():
            for out in e.step():
                done[out.seq_id] = out
            step += 1
            for sid in ids[step % 3:: 5]:  # abort a few requests, each at a fixed step, if still running
                if sid not in done and sid in e.seqs and step in (2, 5):
                    done[sid] = e.abort(sid)
            e.check_invariants()
        answers[overlap] = {sid: out.output_ids for sid, out in done.items() if not out.aborted}
        assert any(out.aborted for out in done.values())
    common = answers[True].keys() & answers[False].keys()
    assert common and all(answers[True][sid] == answers[False][sid] for sid in common)


def test_a_finished_request_is_noticed_one_step_late(model):
    """Its stop token is read one step after it was sampled: one more decode step ran, its token dropped."""
    prompt = [1, 2, 3]
    first = drive_to_end(engine(model, "none", False, 64), [prompt], SamplingParams(max_new_tokens=8))[0].output_ids
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(first[2],))
    steps = {}
    for overlap in (False, True):
        e = engine(model, "none", overlap, tokens=64)
        [out] = drive_to_end(e, [prompt], params)
        assert out.output_ids == first[:3]
        steps[overlap] = e.stats.steps
    assert steps[True] == steps[False] + 1


def test_max_new_tokens_is_not_overrun():
    """A request that sampled all it may is not scheduled again while its last token is still a placeholder."""
    e = OverlapEngine(MODEL, EngineConfig(num_blocks=16, block_size=4))
    e.add_request([1, 2, 3], SamplingParams(max_new_tokens=2))
    [out] = drive_to_end(e)
    assert len(out.output_ids) == 2 and e.stats.steps == 2  # two forwards (prefill, one decode), not a third


def test_a_placeholder_takes_the_previous_steps_token_on_the_device():
    e = OverlapEngine(MODEL, EngineConfig(num_blocks=16, block_size=4))
    e.add_request([5, 6, 7], SamplingParams(max_new_tokens=4))
    assert e.step() == []  # the prefill is launched; its token is not read yet
    [seq] = e.scheduler.running
    assert seq.num_in_flight == 1 and seq.output_ids == [] and seq.num_pending_tokens == 1
    batch = decodes_first(e.scheduler.schedule())
    ids, holes = e._token_ids(batch)
    assert ids == [0] and holes == [(0, 0)], "row 0 waits for the previous step's token 0"
    forward_batch, _ = e._prepare(batch, ids)
    e._fill_placeholders(forward_batch, holes)
    assert forward_batch.input_ids.tolist() == e._inflight.tokens.tolist()
    assert forward_batch.positions.tolist() == [3]


class OverlapBridgeMachine(EngineMachine):
    """The shared state machine (random add / step / abort, invariants after every operation, answers equal
    step01's) on the overlapped engine, which refuses speculation."""

    speculative_ks = (0,)

    def make_engine(self):
        return OverlapEngine(MODEL, EngineConfig(num_blocks=12, block_size=4, max_num_seqs=3,
                                                 max_num_batched_tokens=10), PREFIX_CACHES["bridge"])


class OverlapHashMachine(EngineMachine):
    speculative_ks = (0,)

    def make_engine(self):
        return OverlapEngine(MODEL, EngineConfig(num_blocks=12, block_size=4, max_num_seqs=3,
                                                 max_num_batched_tokens=10), PREFIX_CACHES["hash"])


TestOverlapBridgeMachine = OverlapBridgeMachine.TestCase
TestOverlapBridgeMachine.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
TestOverlapHashMachine = OverlapHashMachine.TestCase
TestOverlapHashMachine.settings = settings(max_examples=20, stateful_step_count=40, deadline=None)


def test_the_invariants_count_the_tokens_in_flight(model):
    """The overlapped engine writes `num_in_flight` and checks it against the step it launched: a sequence that
    claims one token more, or one the launched step never sampled, is caught."""
    engine = OverlapEngine(model, EngineConfig(num_blocks=32, block_size=4))
    engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=6))
    engine.step()
    engine.check_invariants()
    [seq] = engine.scheduler.running
    assert seq.num_in_flight == 1
    seq.num_in_flight = 2
    with pytest.raises(AssertionError, match="in flight"):
        engine.check_invariants()
