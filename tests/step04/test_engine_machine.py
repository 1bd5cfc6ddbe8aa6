"""Hypothesis state machine over the radix engine (tests/machines.py): random add / step / abort of
shared-prefix prompts on a pool small enough to evict and preempt; invariants (ownership, locks, ref counts)
after every operation; every finished request's tokens equal step01's; the drained engine holds no lock and
leaks no slot."""
from __future__ import annotations

from hypothesis import settings

from step02_paged import Engine, EngineConfig
from step04_radix import RadixKVCacheManager
from tests.machines import MODEL, EngineMachine


class RadixEngineMachine(EngineMachine):
    def make_engine(self):
        return Engine(MODEL, EngineConfig(num_blocks=48, block_size=1, max_num_seqs=3, max_num_batched_tokens=10),
                      RadixKVCacheManager)


TestRadixEngineMachine = RadixEngineMachine.TestCase
TestRadixEngineMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
