"""On the real SmolLM2: the mini-vllm tutorial's shared-prefix scenario through the bridge, and the demo's answer
equal to step01's."""
from __future__ import annotations

import pytest

from step02_paged import Engine, EngineConfig
from step05_bridge import BridgeKVCacheManager
from tests.driver import demo_answer_matches_step01, drive_to_end


@pytest.mark.slow
def test_shared_prefix_hits_like_the_block_hash_identical_and_clean(real_model, shared_prefix_off):
    """The mini-vllm tutorial's expected run, with 16-token blocks: round 1, every request but the first reuses
    the shared prefix's full blocks (9/10); round 2, all do (10/10), up to their last full block before the final token.
    Outputs equal the cache-off engine's (run once for chapters 3 and 5: the fixture shared_prefix_off in
    tests/conftest.py). Afterwards no lock is held and every cached block has ref_count 1: the tree is its only
    holder."""
    prompts, params = shared_prefix_off.prompts, shared_prefix_off.params
    engine = Engine(real_model, EngineConfig(num_blocks=160, block_size=16), BridgeKVCacheManager)
    rounds = [[drive_to_end(engine, [p], params)[0] for p in prompts] for _ in range(2)]
    assert [sum(o.num_cached_tokens > 0 for o in r) / len(r) for r in rounds] == [0.9, 1.0]
    shared = 437 // 16 * 16  # the workload's shared prefix, in whole blocks
    assert [o.num_cached_tokens for o in rounds[0]] == [0] + [shared] * 9
    assert [o.num_cached_tokens for o in rounds[1]] == [(len(p) - 1) // 16 * 16 for p in prompts]
    assert [o.output_ids for o in rounds[0]] == [o.output_ids for o in rounds[1]] == shared_prefix_off.outputs
    assert all(engine.cache_manager.block_manager.ref_count[b] == 1 for b in engine.cache_manager.tree.all_blocks())


@pytest.mark.slow
def test_demo_answer_only_matches_step01(capsys):
    from step05_bridge.__main__ import main

    demo_answer_matches_step01(main, capsys)
    assert main(["--block-size", "0", "--answer-only"]) == 2, "a bad block size is a clear error"
