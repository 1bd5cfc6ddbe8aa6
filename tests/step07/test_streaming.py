"""Streaming, chat and aborts: a streamed answer is the JSON answer in pieces, a chat goes through the model's chat
template, and a client that goes away mid-answer has its request aborted and its blocks given back."""
from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from course.chat import chat_ids
from step01_kvcache.request import SamplingParams
from step07_serving.detokenize import IncrementalText

from .conftest import MODEL, tiny_engine
from .test_server import client

pytestmark = pytest.mark.timeout(120)


def drained(engine, timeout_s: float = 10.0) -> None:
    """Wait until the engine holds no request, then check it gave every block back."""
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished():
        assert time.monotonic() < deadline, "the engine still runs a request nobody waits for"
        time.sleep(0.005)
    assert engine.cache_manager.slot_usage() == (0, 0)
    engine.check_invariants()


@pytest.fixture
def aborted(served, monkeypatch) -> list[int]:
    """The ids the engine loop aborts, in order."""
    _, engine = served
    calls, abort = [], engine.abort
    monkeypatch.setattr(engine, "abort", lambda seq_id: (calls.append(seq_id), abort(seq_id))[1])
    return calls


def test_a_stream_is_the_json_answer_in_pieces(served):
    url, engine = served
    ask = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0)
    whole = client(url).completions.create(**ask)
    chunks = list(client(url).completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices
    drained(engine)


def test_chat_uses_the_chat_template_and_streams_the_same(served, model, tokenizer):
    url, engine = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    ask = dict(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    whole = client(url).chat.completions.create(**ask)
    ids = chat_ids(tokenizer, messages)
    expected = tiny_engine(model).generate([ids], SamplingParams(max_new_tokens=10))[0].output_ids
    assert whole.choices[0].message.content == tokenizer.decode(expected, skip_special_tokens=True)
    assert whole.usage.prompt_tokens == len(ids)
    chunks = list(client(url).chat.completions.create(**ask, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    drained(engine)


def test_a_client_that_leaves_mid_stream_is_aborted(served, aborted):
    url, engine = served
    body = {"model": MODEL, "prompt": "Tell me everything", "max_tokens": 400, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # the answer has begun; now the client hangs up
    drained(engine)
    assert len(aborted) == 1, "the request was not aborted: it ran to max_tokens"


def test_a_client_that_leaves_before_its_json_answer_is_aborted(served, aborted):
    url, engine = served
    body = json.dumps({"model": MODEL, "prompt": "Tell me everything", "max_tokens": 400}).encode()
    with socket.create_connection(("127.0.0.1", httpx.URL(url).port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 10
        while not engine.has_unfinished() and time.monotonic() < deadline:  # wait until it runs, then hang up
            time.sleep(0.002)
    drained(engine)
    assert len(aborted) == 1, "the request was not aborted: it ran to max_tokens"


def test_pieces_never_split_a_character(tokenizer):
    text = "naïve café, 東京 and 👋🏽 again"
    ids = tokenizer(text)["input_ids"]
    out = IncrementalText(tokenizer)
    pieces = [out.add([t], final=i == len(ids) - 1) for i, t in enumerate(ids)]
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)


def test_a_request_that_ends_in_its_first_step_is_still_answered(served):
    """max_tokens 1: the request finishes in the step right after it is queued, maybe before its handler starts
    reading; its answer must still arrive, streamed or not."""
    url, engine = served
    for i in range(20):
        ask = dict(model=MODEL, prompt=list(range(4000 + i, 4010 + i)), max_tokens=1, temperature=0)
        streamed = list(client(url).completions.create(**ask, stream=True))
        assert streamed[-1].choices[0].finish_reason == "length"
        assert client(url).completions.create(**ask).usage.completion_tokens == 1
    drained(engine)
