"""Hypothesis state machine over chapter 2's engine (tests/machines.py): random add / step / abort on a pool
small enough to preempt; invariants after every operation; answers equal step01's; drains clean."""
from __future__ import annotations

from hypothesis import settings

from step02_paged import EngineConfig
from tests.driver import engine_for
from tests.machines import MODEL, EngineMachine


class PagedEngineMachine(EngineMachine):
    def make_engine(self):
        return engine_for(MODEL, EngineConfig(num_blocks=12, block_size=4, max_num_seqs=3, max_num_batched_tokens=10),
                          **self.speculation)


TestPagedEngineMachine = PagedEngineMachine.TestCase
TestPagedEngineMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
