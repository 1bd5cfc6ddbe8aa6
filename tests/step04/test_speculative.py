"""Speculative decoding over the radix cache: the tree takes a request's tokens after the rollback (its computed
tokens are verified ones), so no path names a draft, and the slots of rejected drafts go back to the free list."""
from __future__ import annotations

import pytest

from step01_kvcache.tiny import tiny_model
from step02_paged import EngineConfig
from step04_radix import RadixKVCacheManager
from step05_bridge import SpeculativeConfig, SpeculativeEngine
from tests.driver import oracle, shared_prompts, speculation_reuses_only_verified

MODEL = tiny_model(seed=11)
answer = oracle(MODEL)


@pytest.mark.parametrize("num_blocks", [1024, 160], ids=["roomy", "tight"])
def test_speculation_inserts_only_verified_tokens(num_blocks):
    cfg = EngineConfig(num_blocks=num_blocks, block_size=1, max_num_seqs=4, max_num_batched_tokens=24)
    engine = SpeculativeEngine(MODEL, cfg, RadixKVCacheManager, speculative=SpeculativeConfig(4))
    speculation_reuses_only_verified(engine, answer, shared_prompts(6, seed=4), 10,
                                     roomy=num_blocks >= 256)
