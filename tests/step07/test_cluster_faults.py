"""The course's router under faults and load: a replica killed while it serves stops getting requests and the others
serve everything (a JSON request caught on it is answered elsewhere; a stream caught on it ends with an error event,
never hangs), and many concurrent clients (JSON, streams, hang-ups, bad bodies) lose nothing. The surviving
replicas run in this process, so that their engines can be checked: every pool drains to empty, every invariant
holds; the replica that dies is a process, killed with SIGKILL."""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from contextlib import contextmanager

import httpx
import pytest

from course.chat import chat, chat_ids, stop_ids
from step01_kvcache.request import SamplingParams
from step02_paged import Engine, EngineConfig
from step03_prefix_hash import PrefixCachingKVCacheManager
from step07_serving import make_app, running
from step07_serving.cache_events import with_events
from step07_serving.cluster import replicas
from step07_serving.kv_events import EventLog, ZmqPublisher
from step07_serving.router import Router, make_router
from step07_serving.routing import CacheAware

from .conftest import MODEL, tiny_engine
from .test_cluster import BLOCK_SIZE, save_checkpoint, serve_args

pytestmark = pytest.mark.timeout(120)

TENANTS = [f"Tenant {t} rules: " + f"answer every question about topic {t} in full sentences. " * 4 for t in range(4)]


@contextmanager
def replica_here(model, tokenizer, num_blocks: int = 48):
    """A replica served from a thread of this process, publishing its KV events: (URL, events endpoint, engine)."""
    log = EventLog()
    engine = Engine(model, EngineConfig(num_blocks=num_blocks, block_size=BLOCK_SIZE, max_num_seqs=4),
                    with_events(PrefixCachingKVCacheManager, log))
    publisher = ZmqPublisher("tcp://127.0.0.1:*")
    try:
        with running(make_app(engine, tokenizer, MODEL, lambda finished: publisher.publish(log.take()))) as url:
            yield url, publisher.endpoint, engine
    finally:
        publisher.close()


@contextmanager
def routed(urls, endpoints, tokenizer):
    router = Router(urls, endpoints, CacheAware(), tokenizer, BLOCK_SIZE)
    with running(make_router(router)) as url:
        yield url, router


def drained(*engines, timeout_s: float = 10.0) -> None:
    """Until no engine holds a request or a block (a hang-up's abort lands in the engine's next pass)."""
    deadline = time.monotonic() + timeout_s
    while any(e.has_unfinished() or e.cache_manager.slot_usage() != (0, 0) for e in engines):
        assert time.monotonic() < deadline, [e.cache_manager.slot_usage() for e in engines]
        time.sleep(0.01)
    for engine in engines:
        engine.check_invariants()


def expected(model, tokenizer, prompt: str, max_tokens: int) -> str:
    ids = tokenizer(prompt)["input_ids"]
    out = tiny_engine(model).generate([ids], SamplingParams(max_new_tokens=max_tokens))[0].output_ids
    return tokenizer.decode(out, skip_special_tokens=True)


async def ask(http: httpx.AsyncClient, prompt: str, max_tokens: int, stream: bool = False) -> tuple[int, str]:
    """(status, text) of one completion; a stream's text is its pieces, and it must end with [DONE] or an error."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if not stream:
        answer = await http.post("/v1/completions", json=body)
        return answer.status_code, answer.json()["choices"][0]["text"] if answer.status_code == 200 else ""
    pieces, end = [], None
    async with http.stream("POST", "/v1/completions", json=body) as answer:
        async for line in answer.aiter_lines():
            if line == "data: [DONE]":
                end = "done"
            elif line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    end = "error"
                else:
                    pieces += [c["text"] for c in chunk["choices"]]
    assert end is not None, "a stream ended with neither [DONE] nor an error event"
    return (answer.status_code if end == "done" else 503), "".join(pieces)


def test_a_replica_killed_mid_run_is_routed_around(model, tokenizer, tmp_path):
    checkpoint = save_checkpoint(model, tokenizer, tmp_path / "checkpoint")
    prompts = [TENANTS[i % 4] + f"Question {i}?" for i in range(16)]
    with replicas(1, serve_args(checkpoint), tmp_path, threads=1) as [doomed], \
            replica_here(model, tokenizer) as (url_a, events_a, engine):
        with routed([url_a, doomed.url], [events_a, doomed.events], tokenizer) as (url, router):
            async def run() -> tuple[list, list]:
                async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                    # long answers, so that requests are still running on the doomed replica when it dies
                    first = [asyncio.ensure_future(ask(http, p, 48, stream=i % 4 == 3)) for i, p in
                             enumerate(prompts[:8])]
                    deadline = time.monotonic() + 30
                    while router.replicas[1].in_flight == 0 or router.replicas[1].view.blocks == {}:
                        assert time.monotonic() < deadline, "nothing was ever sent to the second replica"
                        await asyncio.sleep(0.005)
                    caught = router.replicas[1].in_flight
                    os.killpg(doomed.process.pid, signal.SIGKILL)
                    before = await asyncio.gather(*first)
                    after = await asyncio.gather(*(ask(http, p, 8, stream=i % 2 == 1) for i, p in enumerate(prompts)))
                    return caught, before, after
            caught, before, after = asyncio.run(run())
            assert caught >= 1  # requests were running on the replica when it died
            doomed.process.wait(10)
            assert not router.replicas[1].healthy and router.replicas[1].in_flight == 0
            assert router.replicas[0].in_flight == 0 and not any(r.running for r in router.replicas)
        drained(engine)
    for i, (status, text) in enumerate(before):  # answered in full, or a stream told of the failure
        if i % 4 == 3 and status == 503:
            continue
        assert (status, text) == (200, expected(model, tokenizer, prompts[i], 48)), i
    assert all(status == 200 for status, _ in after)  # the survivor serves everything after the kill
    assert [text for _, text in after] == [expected(model, tokenizer, p, 8) for p in prompts]


def test_many_clients_through_the_router_lose_nothing(model, tokenizer):
    """40 clients at once through the router to two replicas: JSON, streams, chats, hang-ups after the first event,
    and bodies the replicas refuse; every answer is the engine's, every refusal is OpenAI's envelope, and afterwards
    neither the router nor any replica holds anything."""
    rng = random.Random(7)
    kinds = [rng.choice(["json", "stream", "chat", "hang-up", "bad"]) for _ in range(40)]
    prompts = [TENANTS[i % 4] + f"User {i} asks." for i in range(40)]
    with replica_here(model, tokenizer) as (url_a, events_a, a), replica_here(model, tokenizer) as (url_b, events_b, b):
        with routed([url_a, url_b], [events_a, events_b], tokenizer) as (url, router):
            async def client(http: httpx.AsyncClient, kind: str, prompt: str):
                if kind == "bad":
                    answer = await http.post("/v1/completions", json={"model": MODEL, "prompt": prompt,
                                                                      "max_tokens": -1})
                    return answer.status_code, answer.json()["error"]["type"]
                if kind == "hang-up":
                    body = {"model": MODEL, "prompt": prompt, "max_tokens": 64, "stream": True}
                    async with http.stream("POST", "/v1/completions", json=body) as answer:
                        async for line in answer.aiter_lines():
                            if line.startswith("data: {"):
                                break  # leave with the answer unread
                    return "hung up", None
                if kind == "chat":
                    answer = await http.post("/v1/chat/completions", json={
                        "model": MODEL, "messages": chat(prompt), "max_tokens": 6, "temperature": 0})
                    return answer.status_code, answer.json()["choices"][0]["message"]["content"]
                return await ask(http, prompt, 6, stream=kind == "stream")

            async def run() -> list:
                async with httpx.AsyncClient(base_url=url, timeout=60,
                                             limits=httpx.Limits(max_connections=64)) as http:
                    return await asyncio.gather(*(client(http, k, p) for k, p in zip(kinds, prompts)))
            answers = asyncio.run(run())
            drained(a, b)
            deadline = time.monotonic() + 10
            while any(r.in_flight for r in router.replicas):
                assert time.monotonic() < deadline, [r.in_flight for r in router.replicas]
                time.sleep(0.01)
            assert not any(r.running for r in router.replicas)
            assert min(r.routed for r in router.replicas) > 0 and all(r.healthy for r in router.replicas)
    for kind, prompt, answer in zip(kinds, prompts, answers):
        if kind == "bad":
            assert answer == (400, "invalid_request_error")
        elif kind == "hang-up":
            assert answer == ("hung up", None)
        elif kind == "chat":
            params = SamplingParams(max_new_tokens=6, stop_token_ids=stop_ids(tokenizer))
            out = tiny_engine(model).generate([chat_ids(tokenizer, chat(prompt))], params)
            assert answer == (200, tokenizer.decode(out[0].output_ids, skip_special_tokens=True))
        else:
            assert answer == (200, expected(model, tokenizer, prompt, 6)), (kind, prompt)


def test_no_replica_left_is_a_503_in_openais_envelope(tokenizer):
    with routed(["http://127.0.0.1:9"], [None], tokenizer) as (url, router):  # port 9: nobody listens
        answer = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        assert answer.status_code == 503 and answer.json()["error"]["message"] == "no replica is available"
        assert httpx.get(f"{url}/health").status_code == 503
        assert not router.replicas[0].healthy and router.replicas[0].in_flight == 0
