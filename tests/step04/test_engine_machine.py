"""Hypothesis state machine over the radix engine (tests/machines.py): random add / step / abort of
shared-prefix prompts on a pool small enough to evict and preempt; invariants (ownership, locks, ref counts)
after every operation; every finished request's tokens equal step01's; the drained engine holds no lock and
leaks no slot."""
from __future__ import annotations

from hypothesis import settings

from step04_radix import RadixEngine, RadixEngineConfig
from tests.driver import check_drained
from tests.machines import MODEL, EngineMachine


class RadixEngineMachine(EngineMachine):
    def make_engine(self):
        return RadixEngine(MODEL, RadixEngineConfig(num_blocks=48, max_num_seqs=3, max_num_batched_tokens=10))

    def check_drained(self):
        check_drained(self.engine)


TestRadixEngineMachine = RadixEngineMachine.TestCase
TestRadixEngineMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
