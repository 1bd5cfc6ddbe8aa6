"""Speculative decoding over the hashed prefix cache: a block is hashed from the sequence's verified tokens and
published only once they are computed, after the rollback, so no block holding a rejected draft is ever found."""
from __future__ import annotations

import pytest

from step01_kvcache.tiny import tiny_model
from step02_paged import EngineConfig
from step03_prefix_hash import PrefixCachingKVCacheManager
from step05_bridge import SpeculativeConfig, SpeculativeEngine
from step05_bridge.rollback import release_rejected_blocks, rollback
from tests.driver import oracle, speculation_reuses_only_verified

from .helpers import shared_prefix_prompts

MODEL = tiny_model(seed=11)
answer = oracle(MODEL)


@pytest.mark.parametrize("block_size,num_blocks", [(4, 256), (4, 24), (16, 64)], ids=["roomy", "tight", "16"])
def test_speculation_publishes_only_verified_blocks(block_size, num_blocks):
    """A tight pool adds preemptions and evictions under the drafts."""
    prompts = shared_prefix_prompts(6, seed=3, block_size=block_size)
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=4, max_num_batched_tokens=24)
    engine = SpeculativeEngine(MODEL, cfg, PrefixCachingKVCacheManager, speculative=SpeculativeConfig(4))
    speculation_reuses_only_verified(engine, answer, prompts, 10, roomy=num_blocks >= 256)


def test_a_block_waits_until_the_token_in_its_last_slot_is_computed():
    """Block size 4: 6 tokens computed, the pending token at position 6, drafts at 7-9. The model rejects them all
    and samples another token for position 7, whose slot still holds the first draft's K/V: block 1 (positions
    4-7) is full of verified tokens, but it is published only after the next step writes position 7. Without the
    rollback the counter would say 10, and block 1 would be published with a rejected draft's K/V in it."""
    from step02_paged.geometry import PoolGeometry

    from .helpers import admit, hseq

    kv = PrefixCachingKVCacheManager(PoolGeometry(8, 4))
    seq = hseq(0, list(range(7)))
    admit(kv, seq)
    seq.advance(6)
    kv.on_computed(seq)
    seq.spec_token_ids = [97, 98, 99]
    assert kv.allocate_slots(seq, seq.num_pending_tokens)
    seq.advance(4)
    seq.spec_token_ids = []
    rollback(seq, 3)
    release_rejected_blocks(kv, seq)
    kv.on_computed(seq)
    seq.append_token(55)  # the token the model sampled for position 7: block 1's tokens are known and hashed
    kv.on_computed(seq)
    assert len(seq.block_hashes) == 2 and kv.block_manager.num_cached == 1 and len(seq.block_table) == 2
    kv.check_invariants()
    assert kv.allocate_slots(seq, 1)  # the next step writes position 7
    seq.advance(1)
    kv.on_computed(seq)
    assert kv.block_manager.num_cached == 2
