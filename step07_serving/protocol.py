"""The OpenAI API's shapes, as far as this server speaks it: request bodies checked by pydantic, responses built as
plain dicts, and errors in OpenAI's envelope (`{"error": {"message", "type", "param", "code"}}`), so that any
OpenAI client (the `openai` package, `curl`, a router) can talk to the course's engine.

A body is checked twice, each check where it belongs: its shape and ranges here (a malformed body is a 400 before
the engine hears of it), and what only the engine knows (a prompt longer than the pool, a stop token outside the
vocabulary) by the engine's own `add_request`, which refuses with nothing queued.
"""
from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class OpenAIError(Exception):
    """An error the client caused or asked about: answered with `status` and OpenAI's error envelope."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """The fields both endpoints share. Unknown fields are ignored, as OpenAI's servers do; the known ones are
    range-checked here so that the error names the field the client sent."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0)
    n: Literal[1] = 1  # one answer per request: several would be several requests to the engine
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop_token_ids: list[int] = Field(default_factory=list)  # vLLM's extension: extra token ids that end the answer


class CompletionRequest(SamplingFields):
    """`POST /v1/completions`: a text, or the token ids of one prompt."""

    prompt: str | list[int] = Field(min_length=1)


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions`: messages, rendered by the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # OpenAI's newer name for max_tokens


def request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """Token counts, with the prompt tokens the prefix cache served (OpenAI's `prompt_tokens_details`)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def completion(rid: str, model: str, text: str, finish_reason: str | None, use: dict | None = None,
               chunk: bool = False) -> dict:
    """A `text_completion` body, or one chunk of its stream (the usage chunk that ends a stream has no choices)."""
    choices = [] if chunk and use is not None else [{"index": 0, "text": text, "logprobs": None,
                                                     "finish_reason": finish_reason}]
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model, "choices": choices}
    if use is not None or not chunk:
        body["usage"] = use
    return body


def chat_completion(rid: str, model: str, text: str, finish_reason: str | None, use: dict | None = None) -> dict:
    """A `chat.completion` body."""
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish_reason}],
            "usage": use}


def chat_chunk(rid: str, model: str, delta: dict, finish_reason: str | None, use: dict | None = None) -> dict:
    """One `chat.completion.chunk` of a stream: the first carries the role, the last the finish reason; with
    `include_usage`, a final chunk with no choices carries the usage."""
    choices = [] if use is not None else [{"index": 0, "delta": delta, "logprobs": None,
                                           "finish_reason": finish_reason}]
    body = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": choices}
    if use is not None:
        body["usage"] = use
    return body
