"""KV events in vLLM's format: the bytes on the wire are vLLM's, and a subscriber that sees only the events rebuilds
exactly the blocks the replica's cache holds, for chapter 3's hash, chapter 4's radix tree and chapter 5's bridge,
through evictions and a reset, in process and over ZMQ from a running server."""
from __future__ import annotations

import time

import msgpack
import pytest

from step01_kvcache.request import SamplingParams
from step02_paged import Engine, EngineConfig
from step03_prefix_hash import PrefixCachingKVCacheManager, hash_token_blocks
from step04_radix import RadixKVCacheManager
from step05_bridge import BridgeKVCacheManager
from step07_serving import make_app, running
from step07_serving.cache_events import cached_blocks, with_events
from step07_serving.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheView,
    EventLog,
    Subscriber,
    ZmqPublisher,
    decode_batch,
    encode_batch,
)
from tests.driver import shared_prompts

from .conftest import MODEL
from .test_server import client
from .test_streaming import drained

pytestmark = pytest.mark.timeout(120)


def test_the_wire_format_is_vllms():
    """msgspec's array_like tagged structs: `[ts, [[tag, *fields], ...]]`, hashes as unsigned 64-bit ints."""
    h = hash_token_blocks(list(range(8)), 4)
    log = EventLog(block_size=4)
    log.stored(h, None, list(range(8)))
    log.removed(h[1:])
    log.cleared()
    ts, events = msgpack.unpackb(encode_batch(log.take(), ts=12.5))
    low64 = [int.from_bytes(x[-8:], "big") for x in h]
    assert ts == 12.5
    assert events == [["BlockStored", low64, None, list(range(8)), 4, None, "GPU"],
                      ["BlockRemoved", low64[1:], "GPU"], ["AllBlocksCleared"]]
    assert decode_batch(encode_batch([BlockRemoved([7])]))[1] == [BlockRemoved([7])]


def test_a_prefix_stored_in_steps_is_one_event_per_run():
    """Blocks stored one after another along a prefix merge into one BlockStored, as vLLM reports a step's blocks."""
    h = hash_token_blocks(list(range(12)), 4)
    log = EventLog(block_size=4)
    for i in range(3):
        log.stored([h[i]], h[i - 1] if i else None, list(range(4 * i, 4 * i + 4)))
    [event] = log.take()
    assert event.block_hashes == [int.from_bytes(x[-8:], "big") for x in h] and event.token_ids == list(range(12))


DESIGNS = [(PrefixCachingKVCacheManager, 4, 40), (RadixKVCacheManager, 1, 160), (BridgeKVCacheManager, 4, 40)]


@pytest.mark.parametrize("manager,block_size,num_blocks", DESIGNS, ids=["hash", "radix", "bridge"])
def test_events_rebuild_the_cache_after_every_step(tiny, manager, block_size, num_blocks):
    """Prompts sharing prefixes of random lengths, three at a time through a pool too small to keep them all: after
    every step the blocks rebuilt from the events (through the wire format) are the blocks the cache holds, with
    their parents and tokens; evictions happened; a reset clears both."""
    log, view = EventLog(), CacheView()
    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=4, max_num_batched_tokens=64)
    engine = Engine(tiny, config, with_events(manager, log))
    seen = set()
    for i, prompt in enumerate(shared_prompts(30, seed=1)):
        engine.add_request(prompt, SamplingParams(max_new_tokens=5))
        while i % 3 == 2 and engine.has_unfinished():
            engine.step()
            for event in decode_batch(encode_batch(log.take()))[1]:
                view.apply(event)
                seen.add(type(event))
            assert view.blocks == cached_blocks(engine.cache_manager)
    assert seen == {BlockStored, BlockRemoved}, "the pool was meant to evict"
    assert {e.block_size for e in log.events if isinstance(e, BlockStored)} <= {block_size}
    engine.cache_manager.reset_cache()
    assert log.take() == [AllBlocksCleared()]
    engine.check_invariants()


def test_a_subscriber_rebuilds_a_running_servers_cache(tiny, tokenizer):
    """The bridge behind the server, publishing on a ZMQ socket of 127.0.0.1: clients share prefixes through a
    small pool; the subscriber's view, built from the events alone, equals the tree's blocks once the server is idle,
    and no batch was lost."""
    log = EventLog()
    engine = Engine(tiny, EngineConfig(num_blocks=24, block_size=4), with_events(BridgeKVCacheManager, log))
    publisher = ZmqPublisher("tcp://127.0.0.1:*")
    subscriber = Subscriber(publisher.endpoint)
    time.sleep(0.3)  # a SUB socket misses what is published before it has joined (ZMQ's "slow joiner")
    view = CacheView()
    try:
        with running(make_app(engine, tokenizer, MODEL, lambda finished: publisher.publish(log.take()))) as url:
            for prompt in shared_prompts(12, seed=2):
                client(url).completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0)
            drained(engine)
            deadline = time.monotonic() + 5
            while view.blocks != cached_blocks(engine.cache_manager) and time.monotonic() < deadline:
                for batch in subscriber.receive(timeout_s=0.1):
                    for event in batch:
                        view.apply(event)
            assert view.blocks == cached_blocks(engine.cache_manager) != {}
            assert engine.cache_manager.num_evicted > 0, "the pool was meant to evict"
            assert subscriber.next_seq == publisher.seq
    finally:
        subscriber.close()
        publisher.close()
