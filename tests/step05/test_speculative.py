"""Speculative decoding over the bridge: the tree adopts full blocks of verified tokens only (the request's
computed tokens, after the rollback), both levels of counts stay right, and a block that held only rejected drafts
is the request's own, released at once."""
from __future__ import annotations

import pytest

from step01_kvcache.tiny import tiny_model
from step02_paged import EngineConfig
from step05_bridge import BridgeKVCacheManager, SpeculativeConfig, SpeculativeEngine
from tests.driver import oracle, shared_prompts, speculation_reuses_only_verified

MODEL = tiny_model(seed=11)
answer = oracle(MODEL)


@pytest.mark.parametrize("block_size,num_blocks", [(4, 256), (3, 40), (4, 24)], ids=["roomy", "odd", "tight"])
def test_speculation_inserts_only_verified_blocks(block_size, num_blocks):
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=4, max_num_batched_tokens=24)
    engine = SpeculativeEngine(MODEL, cfg, BridgeKVCacheManager, speculative=SpeculativeConfig(4))
    speculation_reuses_only_verified(engine, answer, shared_prompts(6, seed=5), 10,
                                     roomy=num_blocks >= 256)
