"""KV-cache events in vLLM's wire format: what a replica tells routers about the blocks its prefix cache holds.

A router that wants to send a request where its prefix is cached (vLLM's production stack, `vllm-router`'s
`kv_aware`, llm-d, NVIDIA Dynamo) cannot look into a replica's pool; it rebuilds the pool's *contents* from a stream
of events: `BlockStored` when full blocks become reusable, `BlockRemoved` when they are evicted, `AllBlocksCleared`
when the cache is reset. Each block is named by its chained hash (chapter 3's: the parent's hash stands for the whole
prefix), so a router can hash a new prompt the same way and look its blocks up.

The format is vLLM's (`vllm/distributed/kv_events.py`): msgspec structs with `array_like=True` and `tag=True`, so
each event goes on the wire as a msgpack array whose first element is its class name, and a batch as `[ts, events]`:

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
    ["BlockRemoved", block_hashes, medium]
    ["AllBlocksCleared"]

Hashes travel as vLLM sends them by default (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`): the low 64 bits of the digest,
big-endian, as an unsigned int. A `BlockStored` lists consecutive blocks of one prefix (`parent_block_hash` is the
block before the first one, None at the root) and their tokens, concatenated. Publishing is vLLM's too: a ZMQ PUB
socket, one multipart message per batch, `(topic, sequence number as 8 big-endian bytes, msgpack payload)`, so that
a subscriber notices a gap. (vLLM can also answer replay requests for missed batches on a ROUTER socket; a
subscriber here that sees a gap must resynchronise some other way.)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import msgpack
import zmq

from step03_prefix_hash import BlockHash

MEDIUM = "GPU"  # vLLM's name for the engine's own pool (its "CPU" names the offloading tier)
TOPIC = "kv-events"


def wire_hash(block_hash: BlockHash) -> int:
    """A 32-byte block hash as vLLM puts it on the wire: its low 64 bits, big-endian."""
    return int.from_bytes(block_hash, "big") & (2**64 - 1)


@dataclass
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM


@dataclass
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None = MEDIUM


@dataclass
class AllBlocksCleared:
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
_FIELDS = {cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared)}


def encode_batch(events: list[KVCacheEvent], ts: float | None = None) -> bytes:
    """A `KVEventBatch` as msgpack: `[ts, [[tag, *fields], ...]]`."""
    wire = [[type(e).__name__, *e.__dict__.values()] for e in events]
    return msgpack.packb([time.time() if ts is None else ts, wire])


def decode_batch(payload: bytes) -> tuple[float, list[KVCacheEvent]]:
    """(ts, events) of a payload; a batch may carry more fields after the events (vLLM's data-parallel rank)."""
    ts, wire, *_ = msgpack.unpackb(payload)
    return ts, [_FIELDS[tag](*fields) for tag, *fields in wire]


@dataclass
class EventLog:
    """What the cache manager did since the last `take()`, merged as vLLM's block pool reports it: blocks stored one
    after another along one prefix make one `BlockStored`, consecutive removals one `BlockRemoved`."""

    block_size: int = 0  # set by the manager's factory (cache_events.with_events), the pool's block size
    events: list[KVCacheEvent] = field(default_factory=list)

    def stored(self, block_hashes: list[BlockHash], parent: BlockHash | None, token_ids: list[int]) -> None:
        hashes, up = [wire_hash(h) for h in block_hashes], None if parent is None else wire_hash(parent)
        last = self.events[-1] if self.events else None
        if isinstance(last, BlockStored) and up is not None and last.block_hashes[-1] == up:
            last.block_hashes += hashes
            last.token_ids += token_ids
        else:
            self.events.append(BlockStored(hashes, up, list(token_ids), self.block_size))

    def removed(self, block_hashes: list[BlockHash]) -> None:
        if not block_hashes:
            return
        hashes = [wire_hash(h) for h in block_hashes]
        if self.events and isinstance(self.events[-1], BlockRemoved):
            self.events[-1].block_hashes += hashes
        else:
            self.events.append(BlockRemoved(hashes))

    def cleared(self) -> None:
        self.events.append(AllBlocksCleared())

    def take(self) -> list[KVCacheEvent]:
        events, self.events = self.events, []
        return events


class ZmqPublisher:
    """A PUB socket bound to `endpoint` (`tcp://127.0.0.1:*` picks a free port: see `.endpoint`); `publish` never
    blocks (a PUB socket drops what no subscriber can take)."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:5557", topic: str = TOPIC) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.PUB)
        self.socket.bind(endpoint)
        self.topic, self.seq = topic.encode(), 0

    @property
    def endpoint(self) -> str:
        return self.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def publish(self, events: list[KVCacheEvent]) -> None:
        if events:
            self.socket.send_multipart([self.topic, self.seq.to_bytes(8, "big"), encode_batch(events)])
            self.seq += 1

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


class Subscriber:
    """A SUB socket on a publisher's endpoint: `receive` returns the batches that arrived, in order, and raises if a
    sequence number was skipped (a batch was lost: the subscriber's view is wrong from then on)."""

    def __init__(self, endpoint: str, topic: str = TOPIC) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.socket.connect(endpoint)
        self.next_seq: int | None = None

    def receive(self, timeout_s: float = 0.0) -> list[list[KVCacheEvent]]:
        batches = []
        while self.socket.poll(timeout_s * 1000 if not batches else 0):
            _, seq, payload = self.socket.recv_multipart()
            seq = int.from_bytes(seq, "big")
            if self.next_seq is not None and seq != self.next_seq:
                raise RuntimeError(f"KV events {self.next_seq}..{seq - 1} were lost")
            self.next_seq = seq + 1
            batches.append(decode_batch(payload)[1])
        return batches

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


@dataclass
class CacheView:
    """A replica's cached blocks rebuilt from its events alone, as a router keeps them: wire hash -> (parent's wire
    hash, the block's tokens)."""

    blocks: dict[int, tuple[int | None, tuple[int, ...]]] = field(default_factory=dict)

    def apply(self, event: KVCacheEvent) -> None:
        if isinstance(event, BlockStored):
            parent, bs = event.parent_block_hash, event.block_size
            for i, h in enumerate(event.block_hashes):
                self.blocks[h] = (parent, tuple(event.token_ids[i * bs:(i + 1) * bs]))
                parent = h
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                del self.blocks[h]
        else:
            self.blocks.clear()
