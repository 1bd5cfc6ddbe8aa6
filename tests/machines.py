"""One Hypothesis state machine for every engine: random add / step / abort, `check_invariants()` after every
operation, every finished answer equal to step01's `generate`, and a drained engine that returns every block.

A chapter subclasses `EngineMachine` and builds its engine in `make_engine`; what a drained engine may still
hold (chapter 2: nothing; a prefix cache: unlocked cached blocks) is the engine's own `check_invariants()`.
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from course.tiny import tiny_model
from step01_kvcache.generate import SamplingParams, generate

MODEL = tiny_model(seed=3, num_layers=1, hidden_size=32, intermediate_size=32, head_dim=8)
# prompts are a prefix of one of these stems plus a random tail: they share prefixes of every length
STEMS = ([(7 * i) % 256 for i in range(24)], [(7 * i) % 256 for i in range(9)] + [5] * 15, [11] * 24)


@functools.cache
def expected(prompt: tuple[int, ...], new: int) -> list[int]:
    return generate(MODEL, list(prompt), SamplingParams(max_new_tokens=new))


class EngineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.engine = self.make_engine()
        self.live: dict[int, tuple[tuple[int, ...], int]] = {}  # seq_id -> (prompt, max_new_tokens)

    def make_engine(self):
        raise NotImplementedError

    def check_output(self, out, prompt: tuple[int, ...]) -> None:
        """Chapter-specific checks of a finished request (e.g. hits are whole blocks)."""

    def submit(self, prompt: tuple[int, ...], new: int, **kwargs) -> None:
        sid = self.engine.add_request(list(prompt), SamplingParams(max_new_tokens=new), **kwargs)
        self.live[sid] = (prompt, new)

    @rule(stem=st.integers(0, len(STEMS) - 1), cut=st.integers(0, 24), tail=st.lists(st.integers(0, 255), max_size=6),
          new=st.integers(1, 8))
    def add(self, stem, cut, tail, new):
        self.submit(tuple(STEMS[stem][:cut] + tail) or (1,), new)

    @rule()
    def step(self):
        for out in self.engine.step():
            prompt, new = self.live.pop(out.seq_id)
            assert out.output_ids == expected(prompt, new), "the engine changed an answer"
            assert out.num_cached_tokens < len(prompt), "hits are prompt tokens (a recompute's own are not)"
            self.check_output(out, prompt)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data):
        sid = data.draw(st.sampled_from(sorted(self.live)))
        self.engine.abort(sid)
        del self.live[sid]

    @invariant()
    def invariants_hold(self):
        self.engine.check_invariants()

    def teardown(self):
        while self.engine.has_unfinished():
            self.step()
            self.engine.check_invariants()
        assert not self.live and not self.engine.cache_manager.holders, "a request outlived the drain"
        self.engine.check_invariants()  # includes the engine's rule for a drained engine
