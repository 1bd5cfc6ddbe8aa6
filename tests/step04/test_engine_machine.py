"""Hypothesis state machine over the radix engine: random add / step / abort of shared-prefix prompts on a pool
small enough to evict and preempt; invariants (ownership, locks, ref counts) after every operation; every
finished request's tokens equal step01's; the drained engine holds no lock and leaks no slot."""
from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from course.tiny import tiny_model
from step01_kvcache.generate import SamplingParams, generate
from step04_radix import RadixEngine, RadixEngineConfig

MODEL = tiny_model(seed=3, num_layers=1, hidden_size=32, intermediate_size=32, head_dim=8)
STEMS = ([(7 * i) % 256 for i in range(24)], [(11 * i + 5) % 256 for i in range(24)])
SLOTS = 48
_expected: dict[tuple, list[int]] = {}


def expected(prompt: list[int], new: int) -> list[int]:
    key = (tuple(prompt), new)
    if key not in _expected:
        _expected[key] = generate(MODEL, prompt, SamplingParams(max_new_tokens=new))
    return _expected[key]


class RadixEngineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.engine = RadixEngine(MODEL, RadixEngineConfig(num_blocks=SLOTS, max_num_seqs=3,
                                                           max_num_batched_tokens=10))
        self.live: dict[int, tuple[list[int], int]] = {}

    @rule(stem=st.integers(0, 1), shared=st.integers(0, 24), tail=st.lists(st.integers(0, 255), max_size=6),
          new=st.integers(1, 6))
    def add(self, stem, shared, tail, new):
        prompt = STEMS[stem][:shared] + tail or [1]
        self.live[self.engine.add_request(prompt, SamplingParams(max_new_tokens=new))] = (prompt, new)

    @rule()
    def step(self):
        for out in self.engine.step():
            prompt, new = self.live.pop(out.seq_id)
            assert out.output_ids == expected(prompt, new), "the cache changed a token"

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
        tree = self.engine.tree
        assert tree.protected_size == 0 and all(n.lock_ref == 0 for n in tree.nodes()), "a lock outlived its request"
        assert self.engine.kv.block_manager.num_free + tree.total_size == SLOTS, "leaked slots"
        assert not self.engine.kv.holders


TestRadixEngineMachine = RadixEngineMachine.TestCase
TestRadixEngineMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
