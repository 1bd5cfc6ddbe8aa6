"""On the real SmolLM2: the mini-vllm tutorial's shared-prefix scenario, and the demo's answer equal to step01's."""
from __future__ import annotations

import pytest

from tests.driver import demo_answer_matches_step01, drive_to_end

from .helpers import cached_engine


@pytest.mark.slow
def test_shared_prefix_round1_90_percent_round2_100_percent_identical_and_clean(real_model, shared_prefix_off):
    """The mini-vllm tutorial's expected run: 10 requests behind one shared prefix, twice. A request hits when it reuses
    cached blocks: round 1, all but the first (9/10); round 2, all (10/10), each up to its last full block
    before the final token. Outputs equal the cache-off engine's (run once for chapters 3 and 5: the fixture
    shared_prefix_off in tests/conftest.py); afterwards every ref count is 0 and every block is back in the free
    queue."""
    prompts, params, off = shared_prefix_off.prompts, shared_prefix_off.params, shared_prefix_off.outputs
    engine = cached_engine(real_model, num_blocks=160, block_size=16)
    rounds = [[drive_to_end(engine, [p], params)[0] for p in prompts] for _ in range(2)]
    hits = [sum(o.num_cached_tokens > 0 for o in r) / len(r) for r in rounds]
    assert hits == [0.9, 1.0]
    shared = 437 // 16 * 16  # the workload's shared prefix, in whole blocks
    assert [o.num_cached_tokens for o in rounds[0]] == [0] + [shared] * 9
    assert [o.num_cached_tokens for o in rounds[1]] == [(len(p) - 1) // 16 * 16 for p in prompts]
    assert [o.output_ids for o in rounds[0]] == [o.output_ids for o in rounds[1]] == off
    assert engine.cache_manager.stats.hit_requests == 19


@pytest.mark.slow
def test_demo_answer_only_matches_step01(capsys):
    from step03_prefix_hash.__main__ import main

    demo_answer_matches_step01(main, capsys)
