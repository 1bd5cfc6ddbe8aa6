"""The host tier under the bridge: an evicted prefix goes to host memory instead of away, and a later request
brings it back instead of recomputing it — same tokens as without the tier, fewer computed, and every block of
both pools accounted for (host blocks are held by the host tree alone; a drained engine holds nothing else).
The tier's tests run the bridge's other bodies as the stand-in's (stand_in.py: `bridge_with`): the copies'
(task5.host_tier) and the load back's (task5.load_back) alone, or the two together, tagged with both."""
from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import settings

from step01_kvcache.request import SamplingParams
from step01_kvcache.tiny import tiny_config, tiny_model
from step02_paged import Engine, EngineConfig
from step02_paged.geometry import PoolGeometry
from step02_paged.kv_pool import KVPool
from step05_bridge import BridgeKVCacheManager
from step05_bridge.bridge_cache import TieredMatch
from step05_bridge.host_pool import HostPool
from tests.driver import drive_to_end, engine_for
from tests.machines import MODEL, EngineMachine
from tests.step05.stand_in import bridge_with


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


def conversations(n: int = 4, turns: int = 3, seed: int = 0) -> list[list[int]]:
    """Multi-turn requests in arrival order: every conversation's turn t before any turn t+1; a turn's prompt is
    its conversation so far plus 10 new tokens."""
    g = torch.Generator().manual_seed(seed)
    history = [torch.randint(3, 250, (60,), generator=g).tolist() for _ in range(n)]
    requests = []
    for _ in range(turns):
        for c in range(n):
            history[c] = history[c] + torch.randint(3, 250, (10,), generator=g).tolist()
            requests.append(list(history[c]))
    return requests


def tiered(model, host_blocks: int, num_blocks: int = 30, min_load_tokens: int = 8,
           bridge: type[BridgeKVCacheManager] = BridgeKVCacheManager) -> Engine:
    manager = functools.partial(bridge, host_blocks=host_blocks, min_load_tokens=min_load_tokens)
    return Engine(model, EngineConfig(num_blocks=num_blocks, block_size=4, max_num_seqs=2, max_num_batched_tokens=64),
                  manager)


def one_by_one(engine: Engine, requests: list[list[int]]) -> list:
    return [drive_to_end(engine, [r], SamplingParams(max_new_tokens=3))[0] for r in requests]


@pytest.mark.task("task5.host_tier")
@pytest.mark.task("task5.load_back")
def test_returning_conversations_load_their_prefix_back(model):
    """The device pool holds one conversation: without the tier each turn recomputes its history, with it the
    history comes back from host memory. The answers are the same tokens."""
    bridge = bridge_with("task5.host_tier", "task5.load_back")
    off, on = tiered(model, 0, bridge=bridge), tiered(model, 64, bridge=bridge)
    outs = {tier: one_by_one(engine, conversations()) for tier, engine in (("off", off), ("on", on))}
    assert [o.output_ids for o in outs["on"]] == [o.output_ids for o in outs["off"]]
    assert sum(o.num_cached_tokens for o in outs["off"]) == 0, "the device pool was meant to be too small"
    assert sum(o.num_cached_tokens for o in outs["on"]) > 200 and on.cache_manager.host.blocks_loaded > 0
    on.check_invariants()


@pytest.mark.task("task5.host_tier")
def test_save_and_load_move_the_exact_kv():
    """Blocks copied to the host and back land bit for bit, in every layer, at their new device blocks."""
    cfg = tiny_config()
    pool = KVPool(cfg, PoolGeometry(8, 4))
    pool.k.copy_(torch.randn_like(pool.k))
    pool.v.copy_(torch.randn_like(pool.v))
    before_k, before_v = pool.k[:, [2, 5]].clone(), pool.v[:, [2, 5]].clone()
    host = HostPool(pool, num_blocks=4)
    host.save([2, 5], [3, 0])
    pool.k.zero_()
    pool.v.zero_()
    host.load([3, 0], [6, 1])
    assert torch.equal(pool.k[:, [6, 1]], before_k) and torch.equal(pool.v[:, [6, 1]], before_v)
    assert pool.k[:, [0, 2, 3, 4, 5, 7]].abs().sum() == 0, "a block that was not loaded was written"


@pytest.mark.task("task5.host_tier")
def test_a_short_span_is_recomputed_not_loaded(model):
    """Below `min_load_tokens` a copy costs more than the prefill it saves: the span is saved, never loaded, and
    computed again."""
    engine = tiered(model, 64, min_load_tokens=1000, bridge=bridge_with("task5.host_tier"))
    outs = one_by_one(engine, conversations())
    assert engine.cache_manager.host.blocks_saved > 0 and engine.cache_manager.host.blocks_loaded == 0
    assert sum(o.num_cached_tokens for o in outs) == 0


@pytest.mark.task("task5.load_back")
def test_a_small_host_pool_drops_its_least_recently_used_prefixes(model):
    """A host pool for about two conversations: after four, the last one evicted comes back from it, the first
    one was dropped there too and is computed again."""
    engine = tiered(model, host_blocks=40, bridge=bridge_with("task5.load_back"))
    first_turns, second_turns = conversations(n=4, turns=2)[:4], conversations(n=4, turns=2)[4:]
    one_by_one(engine, first_turns)
    kv = engine.cache_manager
    assert kv.host.blocks_saved > 40, "the host pool was meant to overflow"
    recent, oldest = one_by_one(engine, [second_turns[2], second_turns[0]])
    assert recent.num_cached_tokens >= 64 and oldest.num_cached_tokens == 0
    engine.check_invariants()
    kv.reset_cache()
    assert kv.host.block_manager.num_free == 40 and kv.block_manager.num_free == kv.num_blocks
    engine.check_invariants()


def test_the_tier_needs_the_device_pool():
    kv = BridgeKVCacheManager(PoolGeometry(4, 4), host_blocks=8)
    a = kv.new_sequence(0, list(range(15)), SamplingParams(max_new_tokens=1))
    assert kv.allocate_slots(a, 15, kv.get_computed_blocks(a))
    a.admit(0)
    a.advance(15)
    kv.on_computed(a)
    kv.free(a)
    with pytest.raises(RuntimeError, match="device pool"):
        kv.evict(1)


@pytest.mark.task("task5.load_back")
def test_the_lookup_looks_only_and_admission_loads(model):
    """`get_computed_blocks` reports the host part (a `TieredMatch` counting both tiers) without copying anything:
    a cache-aware policy asks about every waiting request. Admission copies it in, and the request shares it."""
    engine = tiered(model, 64, bridge=bridge_with("task5.load_back"))
    first, second = conversations(n=4, turns=2)[:4], conversations(n=4, turns=2)[4:]
    one_by_one(engine, first)
    kv = engine.cache_manager
    seq = kv.new_sequence(99, second[0], SamplingParams(max_new_tokens=3))
    loaded, free = kv.host.blocks_loaded, kv.block_manager.num_free
    match = kv.get_computed_blocks(seq)
    assert isinstance(match, TieredMatch) and match.num_tokens > len(match.blocks) * 4
    assert (kv.host.blocks_loaded, kv.block_manager.num_free) == (loaded, free), "a lookup copied or allocated"
    kv.check_invariants()
    assert kv.allocate_slots(seq, seq.num_tokens - match.num_tokens, match)
    assert kv.host.blocks_loaded == loaded + len(match.host_blocks)
    assert seq.block_table[: match.num_tokens // 4] == kv.tree.match_prefix(second[0][: match.num_tokens])[0]
    kv.free(seq)
    kv.check_invariants()


@pytest.mark.task("task5.load_back")
def test_lpm_over_the_host_tier_keeps_the_answers(model):
    """Chapter 4's longest-prefix-match policy ranks host hits as hits, and loads nothing while it ranks: when
    four conversations come back at once, their answers are the tier-off engine's."""
    from step04_radix.policy import LongestPrefixMatch

    first, second = conversations(n=4, turns=2)[:4], conversations(n=4, turns=2)[4:]
    manager = functools.partial(bridge_with("task5.load_back"), host_blocks=64, min_load_tokens=8)
    on = Engine(model, EngineConfig(num_blocks=30, block_size=4, max_num_seqs=2, max_num_batched_tokens=64),
                manager, policy=LongestPrefixMatch())
    off = tiered(model, 0, bridge=bridge_with("task5.load_back"))
    params = SamplingParams(max_new_tokens=3)
    for engine in (on, off):
        one_by_one(engine, first)  # the device pool keeps the last conversation, the host tier the others
    want = [o.output_ids for o in drive_to_end(off, second, params)]
    got = drive_to_end(on, second, params)
    assert [o.output_ids for o in got] == want
    assert on.cache_manager.host.blocks_loaded > 0 and sum(o.num_cached_tokens for o in got) > 100
    on.check_invariants()


class TieredBridgeMachine(EngineMachine):
    """The shared state machine (random add / step / abort, invariants of both pools after every operation,
    answers equal step01's) on a device pool too small to keep much, over a host pool that fills up too."""

    def make_engine(self):
        manager = functools.partial(BridgeKVCacheManager, host_blocks=10, min_load_tokens=4)
        return engine_for(MODEL, EngineConfig(num_blocks=12, block_size=4, max_num_seqs=3, max_num_batched_tokens=10),
                          manager, **self.speculation)


TestTieredBridgeMachine = TieredBridgeMachine.TestCase
TestTieredBridgeMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
