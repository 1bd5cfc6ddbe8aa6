"""The server under bad input and faults: every malformed or impossible request gets OpenAI's error envelope with
the right status and queues nothing; clients that hang up or never read cost nothing lasting; many concurrent
clients lose nothing. After each, the server answers the next request and the pool drains to empty."""
from __future__ import annotations

import asyncio
import json
import random
import socket

import httpx
import pytest

from step01_kvcache.request import SamplingParams
from step07_serving import make_app, running

from .conftest import MODEL, tiny_engine
from .test_streaming import drained

pytestmark = pytest.mark.timeout(120)

NUM_BLOCKS, BLOCK_SIZE = 12, 16  # a pool of 192 tokens; the tiny model takes 512 positions
OK = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
BAD = {
    "json": (b'{"model": "tiny", "prompt": ', 400),
    "not an object": (b"[1, 2, 3]", 400),
    "no prompt": ({"model": MODEL}, 400),
    "no model": ({"prompt": "Hello"}, 400),
    "unknown model": ({**OK, "model": "gpt-9"}, 404),
    "empty prompt": ({**OK, "prompt": ""}, 400),
    "empty token list": ({**OK, "prompt": []}, 400),
    "prompt of floats": ({**OK, "prompt": [1.5, 2.5]}, 400),
    "token outside the vocabulary": ({**OK, "prompt": [49152]}, 400),
    "negative token": ({**OK, "prompt": [-1]}, 400),
    "prompt over the pool": ({**OK, "prompt": list(range(1000, 1000 + NUM_BLOCKS * BLOCK_SIZE + 1))}, 400),
    "prompt over the model": ({**OK, "prompt": list(range(1000, 1600))}, 400),
    "max_tokens 0": ({**OK, "max_tokens": 0}, 400),
    "max_tokens negative": ({**OK, "max_tokens": -5}, 400),
    "max_tokens absurd": ({**OK, "max_tokens": 10**12}, 400),
    "max_tokens not a number": ({**OK, "max_tokens": "lots"}, 400),
    "negative temperature": ({**OK, "temperature": -0.5}, 400),
    "temperature not a number": ({**OK, "temperature": "hot"}, 400),
    "temperature too small to divide by": ({**OK, "temperature": 1e-9}, 400),
    "top_p 0": ({**OK, "top_p": 0}, 400),
    "top_p above 1": ({**OK, "top_p": 1.5}, 400),
    "n 2": ({**OK, "n": 2}, 400),
    "stop token outside the vocabulary": ({**OK, "stop_token_ids": [10**6]}, 400),
    "chat without messages": ({"model": MODEL, "messages": []}, 400),
    "chat with an unknown role": ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400),
}


@pytest.fixture(scope="module")
def small(model, tokenizer):
    """(base URL, engine, the requests that ended and why) of a server over a small pool: up to four requests run
    at once, the rest wait, and a running one is preempted when the pool runs out."""
    engine = tiny_engine(model, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, max_num_seqs=4)
    ended = []
    with running(make_app(engine, tokenizer, MODEL, ended.extend)) as url:
        yield url, engine, ended


def answers_next(url: str) -> None:
    response = httpx.post(f"{url}/v1/completions", json=OK, timeout=30)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("body,status", BAD.values(), ids=BAD.keys())
def test_bad_input_gets_an_openai_error_and_queues_nothing(small, body, status):
    url, engine, _ = small
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    queried = engine.cache_manager.stats.requests
    response = (httpx.post(f"{url}{path}", content=body, headers={"content-type": "application/json"}, timeout=30)
                if isinstance(body, bytes) else httpx.post(f"{url}{path}", json=body, timeout=30))
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error" and set(error) == {"message", "type", "param",
                                                                                         "code"}
    assert not engine.has_unfinished() and engine.cache_manager.stats.requests == queried, "a bad request was queued"
    answers_next(url)
    drained(engine)


def test_a_client_that_never_reads_blocks_nobody(small):
    """A stream nobody reads: its request still runs to its end and gives its blocks back, and the server answers
    others meanwhile (the engine loop never waits for a socket)."""
    url, engine, _ = small
    body = json.dumps({**OK, "max_tokens": 200, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", httpx.URL(url).port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        answers_next(url)
        drained(engine)
    drained(engine)


def test_concurrent_clients_lose_nothing(small, model, tokenizer):
    """Forty clients at once on the loopback through a pool too small for four of their answers (so requests wait and
    are preempted): some stream, some hang up midway, some send bad bodies. Every one that stays gets its whole greedy
    answer, the one the engine gives alone; every bad one gets a 400; the pool drains to empty."""
    url, engine, ended = small
    ended.clear()
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 5000) for _ in range(rng.randint(5, 60))] for _ in range(40)]
    kinds = ["json", "stream", "leave", "bad"] * 10
    rng.shuffle(kinds)
    new_tokens = 24

    async def one(http: httpx.AsyncClient, prompt: list[int], kind: str):
        leaving = 100  # tokens it would take: far more than it waits for, so it surely leaves a running request
        body = {"model": MODEL, "prompt": prompt, "max_tokens": leaving if kind == "leave" else new_tokens,
                "temperature": 0}
        if kind == "bad":
            return (await http.post("/v1/completions", json={**body, "temperature": -1})).status_code
        if kind == "json":
            answer = (await http.post("/v1/completions", json=body)).json()
            return answer["choices"][0]["text"], answer["usage"]["completion_tokens"]
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            pieces = []
            async for line in response.aiter_lines():
                if kind == "leave" and len(pieces) == 3:
                    return "left"
                if line.startswith("data: {"):
                    pieces.append(json.loads(line[6:])["choices"][0]["text"])
            return "".join(pieces), None

    async def everyone():
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            return await asyncio.gather(*(one(http, p, k) for p, k in zip(prompts, kinds)))

    results = asyncio.run(everyone())
    alone = tiny_engine(model).generate(prompts, SamplingParams(max_new_tokens=new_tokens))
    for kind, result, out in zip(kinds, results, alone):
        if kind == "bad":
            assert result == 400
        elif kind == "leave":
            assert result == "left"
        else:
            text, count = result
            assert text == tokenizer.decode(out.output_ids, skip_special_tokens=True)
            assert count in (None, new_tokens)
    drained(engine)
    reasons = [reason for _, reason in ended]
    assert reasons.count("abort") == kinds.count("leave") and len(reasons) == 30
    assert any(out.num_preemptions for out, _ in ended), "the pool was meant to preempt"
    answers_next(url)
