"""Hypothesis state machine: random add / step / abort; invariants after every operation; drains clean."""
from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from course.tiny import tiny_model
from step01_kvcache.generate import SamplingParams
from step02_paged import Engine, EngineConfig

MODEL = tiny_model(seed=3, num_layers=1, hidden_size=32, intermediate_size=32, head_dim=8)


class EngineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.engine = Engine(MODEL, EngineConfig(num_blocks=12, block_size=4, max_num_seqs=3,
                                                 max_num_batched_tokens=10))
        self.live: set[int] = set()

    @rule(n=st.integers(1, 30), new=st.integers(1, 8))
    def add(self, n, new):
        self.live.add(self.engine.add_request([(7 * i) % 256 for i in range(n)], SamplingParams(max_new_tokens=new)))

    @rule()
    def step(self):
        for out in self.engine.step():
            self.live.discard(out.seq_id)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data):
        sid = data.draw(st.sampled_from(sorted(self.live)))
        self.engine.abort(sid)
        self.live.discard(sid)

    @invariant()
    def invariants_hold(self):
        self.engine.check_invariants()

    def teardown(self):
        while self.engine.has_unfinished():
            self.engine.step()
            self.engine.check_invariants()
        assert self.engine.kv.block_manager.num_free == 12


TestEngineMachine = EngineMachine.TestCase
TestEngineMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
