"""One Hypothesis state machine for every engine: random add / step / abort, `check_invariants()` after every
operation, every finished answer equal to step01's `generate`, and a drained engine that returns every block.

Each run draws k from the machine's `speculative_ks` (default (0, 3): half the runs). A run with k = 3 decodes
speculatively: its engine has `num_speculative_tokens` = 3 and a scripted proposer whose drafts the `speculate` rule
makes right or wrong (so rollbacks land anywhere, across block boundaries, before preemptions and aborts); a run
with k = 0 runs chapter 2's plain step. An engine that refuses speculation (the overlapped one) sets (0,).

A chapter subclasses `EngineMachine` and builds its engine in `make_engine`, passing `self.speculation` to
`tests.driver.engine_for` (`start` checks that it did); what a drained engine may still hold (chapter 2: nothing; a
prefix cache: unlocked cached blocks) is the engine's own `check_invariants()`.
"""
from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from step01_kvcache.generate import SamplingParams
from step01_kvcache.tiny import tiny_model
from step05_bridge.speculative_engine import SpeculativeEngine
from tests.driver import oracle, speculative_engine

MODEL = tiny_model(seed=3, num_layers=1, hidden_size=32, intermediate_size=32, head_dim=8)
# prompts are a prefix of one of these stems plus a random tail: they share prefixes of every length
STEMS = ([(7 * i) % 256 for i in range(24)], [(7 * i) % 256 for i in range(9)] + [5] * 15, [11] * 24)


expected = oracle(MODEL)  # step01's greedy answer to (prompt, max_new_tokens), cached


class EngineMachine(RuleBasedStateMachine):
    speculative_ks: tuple[int, ...] = (0, 3)  # the num_speculative_tokens a run draws from

    def __init__(self):
        super().__init__()
        self.engine = None
        self.speculation: dict[str, int] = {}  # engine_for's num_speculative_tokens: speculative decoding on or off
        self.live: dict[int, tuple[tuple[int, ...], int]] = {}  # seq_id -> (prompt, max_new_tokens)

    def make_engine(self):
        raise NotImplementedError

    @initialize(data=st.data())
    def start(self, data):
        k = data.draw(st.sampled_from(self.speculative_ks), label="k")
        self.speculation = {"num_speculative_tokens": k} if k else {}
        self.engine = self.make_engine()
        spec = getattr(self.engine, "speculative", None)
        assert (spec.num_speculative_tokens if spec else 0) == k, "make_engine must pass **self.speculation"
        if k:  # drafts start empty: `speculate` says how many are right
            speculative_engine(self.engine, expected, good=0, bad=0)

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

    @precondition(lambda self: isinstance(self.engine, SpeculativeEngine))
    @rule(good=st.integers(0, 3), bad=st.integers(0, 3))
    def speculate(self, good, bad):
        """From the next step on, drafts are `good` tokens of the true answer, then `bad` wrong ones: the verify
        step keeps the good ones and rolls the sequence back over the rest."""
        self.engine.proposer.good, self.engine.proposer.bad = good, bad

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
