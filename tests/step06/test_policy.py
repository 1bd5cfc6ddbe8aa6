"""`make_engine`'s `policy` option: chapter 4's scheduling policies under every design of chapters 2-5 (paging
alone, block hash, token tree, the bridge) give step01's greedy tokens on a pool small enough to evict; the bridge
with lpm holds every invariant in a Hypothesis state machine; a policy a design cannot run is refused."""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import invariant

from step01_kvcache.tiny import tiny_model
from step02_paged import EngineConfig
from step04_radix.policy import LongestPrefixMatch
from step05_bridge import BridgeKVCacheManager
from step06_triton.engine import make_engine
from tests.driver import drive_to_end, engine_for, most_overtaken, shared_prompts, with_reference
from tests.machines import MODEL, EngineMachine

BLOCK = {"none": 4, "hash": 4, "radix": 1, "bridge": 4}


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=7, num_heads=6, num_kv_heads=2)


@pytest.fixture(scope="module")
def reference(model):
    return with_reference(model, shared_prompts(8, seed=3, stem=40), new_tokens=5)


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight"])
@pytest.mark.parametrize("design", list(BLOCK))
def test_every_design_gives_step01_tokens_under_every_policy(model, reference, design, policy):
    prompts, params, expected = reference
    options = dict(num_blocks=160 // BLOCK[design], block_size=BLOCK[design], max_num_seqs=3,
                   max_num_batched_tokens=24)
    if policy == "dfs-weight" and design in ("none", "hash"):
        with pytest.raises(ValueError, match="radix tree"):
            make_engine(model, design, "torch", policy=policy, **options)
        return
    engine = make_engine(model, design, "torch", policy=policy, **options)
    assert engine.scheduler.policy.name == policy
    for round_ in range(2):
        outs = drive_to_end(engine, prompts, params)
        assert [o.output_ids for o in outs] == expected, f"round {round_}"
    if design != "none":
        assert sum(o.num_cached_tokens for o in outs) > 0, "round 2 was meant to hit the prefix cache"
    if policy == "fcfs":
        assert most_overtaken(engine) == 0


def test_unknown_policy_is_refused(model):
    with pytest.raises(ValueError, match="lpm"):
        make_engine(model, "bridge", "torch", policy="longest")


class LPMBridgeEngineMachine(EngineMachine):
    """Chapter 5's bridge admitting by longest cached prefix (bound 2, and a fallback threshold the queue crosses):
    both levels of counts after every operation, step01's answers, nobody overtaken more than twice."""

    def make_engine(self):
        cfg = EngineConfig(num_blocks=12, block_size=4, max_num_seqs=3, max_num_batched_tokens=10)
        return engine_for(MODEL, cfg, BridgeKVCacheManager, policy=LongestPrefixMatch(max_overtakes=2, fcfs_above=4),
                          **self.speculation)

    @invariant()
    def overtaking_is_bounded(self):
        assert most_overtaken(self.engine) <= 2


TestLPMBridgeEngineMachine = LPMBridgeEngineMachine.TestCase
TestLPMBridgeEngineMachine.settings = settings(max_examples=25, stateful_step_count=40, deadline=None)
