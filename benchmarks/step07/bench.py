"""`python -m benchmarks.step07.bench [--save]`: the `short` workload through the server on the real model, once per
cache design, with a ZMQ subscriber on the server's KV events; writes results/short.json.

Each round of the workload (three requests, one per persona) is sent at once by streaming clients on 127.0.0.1, as
an application would; the pool is sized so that the second round's system prompts do not all fit beside the first
round's answers, so the cache both reuses and evicts. Per design it records what the clients saw (time to the first
streamed event, cached prompt tokens from the usage) and what the subscriber saw (batches, events, blocks stored
and removed, bytes on the wire), and whether the blocks rebuilt from the events equal the cache's own at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import httpx

from course import results
from course.tokenizer import load_tokenizer
from course.workloads import get_workload
from step01_kvcache.pretrained import DEFAULT_MODEL, load_model
from step02_paged import Engine, EngineConfig
from step07_serving.cache_events import DESIGNS, cached_blocks, with_events
from step07_serving.kv_events import (
    BlockRemoved,
    BlockStored,
    CacheView,
    EventLog,
    Subscriber,
    ZmqPublisher,
    encode_batch,
)
from step07_serving.server import make_app, running

POOL_TOKENS = 640  # fewer than the workload's three system prompts and three running answers need at once
NEW_TOKENS = 16
PER_ROUND = 3


async def _round(url: str, prompts: list[list[int]]) -> list[dict]:
    """One round's requests at once, streamed: per request its text, time to the first event and usage."""
    async def one(http: httpx.AsyncClient, prompt: list[int]) -> dict:
        body = {"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        start, first, text, use = time.perf_counter(), None, [], None
        async with http.stream("POST", "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                first = first or time.perf_counter() - start
                chunk = json.loads(line[6:])
                text += [c["text"] for c in chunk["choices"]]
                use = chunk.get("usage") or use
        return {"text": "".join(text), "ttft_s": first, "usage": use}

    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        return await asyncio.gather(*(one(http, p) for p in prompts))


def run_design(design: str, model, tok, prompts: list[list[int]]) -> dict:
    block_size = 1 if design == "radix" else 16
    log = EventLog()
    engine = Engine(model, EngineConfig(num_blocks=POOL_TOKENS // block_size, block_size=block_size,
                                        max_num_seqs=PER_ROUND), with_events(DESIGNS[design], log))
    publisher = ZmqPublisher("tcp://127.0.0.1:*")
    subscriber = Subscriber(publisher.endpoint)
    time.sleep(0.3)  # a SUB socket misses what is published before it has joined
    batches, wire_bytes = [], 0
    try:
        def publish(finished) -> None:
            nonlocal wire_bytes
            events = log.take()
            wire_bytes += len(encode_batch(events)) if events else 0
            publisher.publish(events)

        with running(make_app(engine, tok, DEFAULT_MODEL, publish)) as url:
            answers = [a for i in range(0, len(prompts), PER_ROUND)
                       for a in asyncio.run(_round(url, prompts[i:i + PER_ROUND]))]
            time.sleep(0.2)
            batches = subscriber.receive(timeout_s=1.0)
        engine.check_invariants()
    finally:
        subscriber.close()
        publisher.close()
    view = CacheView()
    for event in (e for batch in batches for e in batch):
        view.apply(event)
    events = [e for batch in batches for e in batch]
    cached = [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    ttft = [a["ttft_s"] for a in answers]
    return dict(design=design, block_size=block_size, num_blocks=engine.config.num_blocks,
                prompt_tokens=sum(len(p) for p in prompts), cached_tokens=sum(cached),
                hit_rate=round(sum(cached) / sum(len(p) for p in prompts), 4),
                ttft_first_round_median_s=round(statistics.median(ttft[:PER_ROUND]), 4),
                ttft_later_rounds_median_s=round(statistics.median(ttft[PER_ROUND:]), 4),
                event_batches=len(batches),
                stored_events=sum(isinstance(e, BlockStored) for e in events),
                stored_blocks=sum(len(e.block_hashes) for e in events if isinstance(e, BlockStored)),
                removed_blocks=sum(len(e.block_hashes) for e in events if isinstance(e, BlockRemoved)),
                wire_bytes=wire_bytes, cached_blocks_at_end=len(view.blocks),
                rebuilt_equal=view.blocks == cached_blocks(engine.cache_manager),
                texts=[a["text"] for a in answers])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step07.bench", description=__doc__.splitlines()[0])
    p.add_argument("--designs", default="hash,radix,bridge", help="comma-separated: none, hash, radix, bridge")
    p.add_argument("--save", action="store_true", help="write step07_serving/results/short.json")
    args = p.parse_args(argv)
    meta = results.started("python -m benchmarks.step07.bench --save")
    model, tok = load_model(), load_tokenizer()
    prompts = get_workload("short").prompts(tok)
    rows = [run_design(d, model, tok, prompts) for d in args.designs.split(",")]
    same = all(r["texts"] == rows[0]["texts"] for r in rows)
    for r in rows:
        r.pop("texts")
        print(json.dumps(r))
    figures = dict(workload="short", requests=len(prompts), new_tokens=NEW_TOKENS, per_round=PER_ROUND,
                   pool_tokens=POOL_TOKENS, designs=rows, outputs_identical=same)
    if args.save:
        print(f"wrote {results.save('step07', 'short', figures, meta)}")
    print(json.dumps({k: v for k, v in figures.items() if k != "designs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
