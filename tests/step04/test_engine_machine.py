"""Hypothesis state machine over the radix engine (tests/machines.py): random add / step / abort of
shared-prefix prompts on a pool small enough to evict and preempt; invariants (ownership, locks, ref counts)
after every operation; every finished request's tokens equal step01's; the drained engine holds no lock and
leaks no slot. The same machine again with the cache-aware policies (on this tree and on chapter 3's hash):
nothing changes but the order of admission, and no request is overtaken more than the bound."""
from __future__ import annotations

from hypothesis import settings
from hypothesis.stateful import invariant

from step02_paged import EngineConfig
from step03_prefix_hash import PrefixCachingKVCacheManager
from step04_radix import RadixKVCacheManager
from step04_radix.policy import DFSWeight, LongestPrefixMatch
from tests.driver import engine_for, most_overtaken
from tests.machines import MODEL, EngineMachine


class RadixEngineMachine(EngineMachine):
    def make_engine(self):
        return engine_for(MODEL, EngineConfig(num_blocks=48, block_size=1, max_num_seqs=3, max_num_batched_tokens=10),
                      RadixKVCacheManager, **self.speculation)


TestRadixEngineMachine = RadixEngineMachine.TestCase
TestRadixEngineMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


class LPMRadixEngineMachine(EngineMachine):
    """lpm with a bound on overtaking, and a fallback threshold that the queue crosses, so both paths run."""

    BOUND = 2

    def policy(self):
        return LongestPrefixMatch(max_overtakes=self.BOUND, fcfs_above=4)

    def make_engine(self):
        return engine_for(MODEL, EngineConfig(num_blocks=48, block_size=1, max_num_seqs=3, max_num_batched_tokens=10),
                      RadixKVCacheManager, policy=self.policy(), **self.speculation)

    @invariant()
    def overtaking_is_bounded(self):
        assert most_overtaken(self.engine) <= self.BOUND


class DFSRadixEngineMachine(LPMRadixEngineMachine):
    def policy(self):
        return DFSWeight(max_overtakes=self.BOUND, fcfs_above=4)


class LPMHashEngineMachine(LPMRadixEngineMachine):
    def make_engine(self):
        return engine_for(MODEL, EngineConfig(num_blocks=12, block_size=4, max_num_seqs=3, max_num_batched_tokens=10),
                      PrefixCachingKVCacheManager, policy=self.policy(), **self.speculation)


POLICY_SETTINGS = settings(max_examples=25, stateful_step_count=40, deadline=None)
TestLPMRadixEngineMachine = LPMRadixEngineMachine.TestCase
TestLPMRadixEngineMachine.settings = POLICY_SETTINGS
TestDFSRadixEngineMachine = DFSRadixEngineMachine.TestCase
TestDFSRadixEngineMachine.settings = POLICY_SETTINGS
TestLPMHashEngineMachine = LPMHashEngineMachine.TestCase
TestLPMHashEngineMachine.settings = POLICY_SETTINGS
