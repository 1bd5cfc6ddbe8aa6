"""Hypothesis state machine over the bridge engine (tests/machines.py): random add / step / abort of
shared-prefix prompts at block sizes 3 and 4 on a pool small enough to evict and preempt; both levels of
reference counts checked after every operation; answers equal step01's; a drained engine leaks no block.
The same machine with a host tier under a cache-aware policy: evictions copy to the host, admissions load back,
and both pools and both trees are checked after every operation."""
from __future__ import annotations

import functools

from hypothesis import settings

from step02_paged import EngineConfig
from step04_radix.policy import LongestPrefixMatch
from step05_bridge import BridgeKVCacheManager
from tests.driver import engine_for
from tests.machines import MODEL, EngineMachine


class BridgeEngineMachine(EngineMachine):
    block_size, num_blocks = 4, 12

    def make_engine(self):
        return engine_for(MODEL, EngineConfig(num_blocks=self.num_blocks, block_size=self.block_size, max_num_seqs=3,
                                          max_num_batched_tokens=10), BridgeKVCacheManager, **self.speculation)

    def check_output(self, out, prompt):
        assert out.num_cached_tokens % self.block_size == 0, "hits are whole blocks"


class OddBlockBridgeMachine(BridgeEngineMachine):
    block_size, num_blocks = 3, 16


class TieredBridgeMachine(BridgeEngineMachine):
    """A device pool of 12 blocks over a host pool of 10, any span of one block or more loaded back, and
    longest-prefix-first admission asking the tiered lookup about every waiting request."""

    def make_engine(self):
        manager = functools.partial(BridgeKVCacheManager, host_blocks=10, min_load_tokens=self.block_size)
        return engine_for(MODEL, EngineConfig(num_blocks=self.num_blocks, block_size=self.block_size, max_num_seqs=3,
                                          max_num_batched_tokens=10), manager,
                      policy=LongestPrefixMatch(), **self.speculation)


TestBridgeEngineMachine = BridgeEngineMachine.TestCase
TestBridgeEngineMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestOddBlockBridgeMachine = OddBlockBridgeMachine.TestCase
TestOddBlockBridgeMachine.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
TestTieredBridgeMachine = TieredBridgeMachine.TestCase
TestTieredBridgeMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
