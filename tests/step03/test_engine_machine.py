"""Hypothesis state machine: random add (shared-prefix prompts, salts) / step / abort / reset, with every
invariant checked after every operation, every finished answer equal to step01's, and a clean drain."""
from __future__ import annotations

import functools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from course.tiny import tiny_model
from step01_kvcache.generate import SamplingParams, generate
from step03_prefix_hash import Engine, EngineConfig

from .helpers import assert_drained, snapshot

MODEL = tiny_model(seed=3, num_layers=1, hidden_size=32, intermediate_size=32, head_dim=8)
STEMS = [[(7 * i) % 256 for i in range(24)], [(7 * i) % 256 for i in range(9)] + [5] * 15, [11] * 24]


@functools.cache
def expected(prompt: tuple[int, ...], new: int) -> list[int]:
    return generate(MODEL, list(prompt), SamplingParams(max_new_tokens=new))


class PrefixEngineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.engine = Engine(MODEL, EngineConfig(num_blocks=12, block_size=4, max_num_seqs=3,
                                                 max_num_batched_tokens=10))
        self.live: dict[int, tuple[tuple[int, ...], int]] = {}
        self.history: list[tuple[int, ...]] = []

    @rule(stem=st.integers(0, len(STEMS) - 1), cut=st.integers(1, 24), tail=st.lists(st.integers(0, 255), max_size=6),
          new=st.integers(1, 8), salt=st.sampled_from([None, None, "a"]))
    def add(self, stem, cut, tail, new, salt):
        self._submit(tuple(STEMS[stem][:cut] + tail), new, salt)

    @precondition(lambda self: self.history)
    @rule(data=st.data(), new=st.integers(1, 4))
    def add_again(self, data, new):
        """An exact repeat of an earlier prompt: once its blocks are cached, a full hit."""
        self._submit(data.draw(st.sampled_from(self.history)), new, None)

    def _submit(self, prompt, new, salt):
        sid = self.engine.add_request(list(prompt), SamplingParams(max_new_tokens=new), cache_salt=salt)
        self.live[sid] = (prompt, new)
        self.history.append(prompt)

    @rule()
    def step(self):
        for out in self.engine.step():
            prompt, new = self.live.pop(out.seq_id)
            assert out.output_ids == expected(prompt, new), "the prefix cache changed an answer"
            assert out.num_cached_tokens <= len(prompt) - 1 and out.num_cached_tokens % 4 == 0

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data):
        sid = data.draw(st.sampled_from(sorted(self.live)))
        self.engine.abort(sid)
        del self.live[sid]

    @rule()
    def reset(self):
        if self.engine.kv.holders:
            before = snapshot(self.engine.kv)
            with pytest.raises(RuntimeError):
                self.engine.reset_prefix_cache()
            assert snapshot(self.engine.kv) == before
        else:
            self.engine.reset_prefix_cache()
            assert self.engine.kv.block_manager.num_cached == 0

    @invariant()
    def invariants_hold(self):
        self.engine.check_invariants()

    def teardown(self):
        while self.engine.has_unfinished():
            self.step()
            self.engine.check_invariants()
        assert_drained(self.engine)


TestPrefixEngineMachine = PrefixEngineMachine.TestCase
TestPrefixEngineMachine.settings = settings(max_examples=60, stateful_step_count=35, deadline=None)
