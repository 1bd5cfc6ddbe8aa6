"""The OpenAI-compatible HTTP server: FastAPI handlers in front of the AsyncEngine.

A handler's life: parse and check the body (protocol.py; a 400 names the field), turn text into token ids (the model's
tokenizer, and for chat its chat template: course/chat.py, as every chapter's demo), `add` the request (the engine
refuses what it cannot run, with nothing queued: another 400), then wait for its deltas, all at once or as a stream
of server-sent events. A client that disconnects is noticed while its request waits, and the request is aborted:
its blocks go back to the pool in the next pass of the loop.

`make_app` builds the app around an engine that is already made, so the tests serve a tiny random model and the
command line the real one, through the same code.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.background import BackgroundTask

from course.chat import chat_ids, stop_ids
from step01_kvcache.request import SamplingParams
from step02_paged import Engine

from . import protocol
from .async_engine import AsyncEngine, Delta, EngineDead, Finished
from .detokenize import IncrementalText
from .metrics import EngineMetrics
from .protocol import ChatCompletionRequest, CompletionRequest, OpenAIError

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 256  # a chat answer without max_tokens: this much at most, or what the context leaves


@dataclass
class Served:
    """What the handlers share: the engine loop, the tokenizer and the one model name this server answers to."""

    engine: AsyncEngine
    tokenizer: object
    model: str

    def sampling(self, body: protocol.SamplingFields, max_tokens: int | None, num_prompt_tokens: int,
                 default: int) -> SamplingParams:
        """The engine's SamplingParams from a body; the model's end-of-turn tokens always stop. Without `max_tokens`,
        `default`, cut to what the model and the pool leave room for (a value the client gave is never cut: if it
        does not fit, the engine refuses it)."""
        if max_tokens is None:
            config, model = self.engine.engine.config, self.engine.engine.model.config
            room = min(model.max_position_embeddings - num_prompt_tokens,
                       config.num_blocks * config.block_size - num_prompt_tokens + 1)
            max_tokens = max(1, min(default, room))
        try:
            return SamplingParams(max_new_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                  seed=body.seed, stop_token_ids=(*stop_ids(self.tokenizer), *body.stop_token_ids))
        except ValueError as e:
            raise OpenAIError(400, str(e)) from None

    def check_model(self, name: str) -> None:
        if name != self.model:
            raise OpenAIError(404, f"The model `{name}` does not exist; this server serves `{self.model}`",
                              param="model", code="model_not_found")

    async def add(self, prompt_ids: list[int], params: SamplingParams) -> int:
        try:
            return await self.engine.add(prompt_ids, params)
        except ValueError as e:  # the engine refused the request: nothing was queued
            raise OpenAIError(400, str(e), param="prompt") from None

    def text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    async def events(self, deltas: AsyncIterator[Delta], name: str, num_prompt_tokens: int, chat: bool,
                     include_usage: bool) -> AsyncIterator[str]:
        """The request's answer as server-sent events, OpenAI's way: a chunk per piece of text (a chat's first chunk
        carries the role), the finish reason on the last, then the usage if asked, then `[DONE]`. An engine that
        stops mid-answer ends the stream with an error event."""
        text, tokens, last = IncrementalText(self.tokenizer), 0, None
        if chat:
            yield sse(protocol.chat_chunk(name, self.model, {"role": "assistant", "content": ""}, None))
        try:
            async for last in deltas:
                tokens += len(last.token_ids)
                piece = text.add(last.token_ids, final=last.finish_reason is not None)
                if piece or last.finish_reason:
                    yield sse(protocol.chat_chunk(name, self.model, {"content": piece} if piece else {},
                                                  last.finish_reason) if chat else
                              protocol.completion(name, self.model, piece, last.finish_reason, chunk=True))
        except EngineDead as e:
            yield sse(OpenAIError(503, str(e)).body())
        if include_usage and last is not None:
            use = protocol.usage(num_prompt_tokens, tokens, last.num_cached_tokens)
            yield sse(protocol.chat_chunk(name, self.model, {}, None, use) if chat else
                      protocol.completion(name, self.model, "", None, use, chunk=True))
        yield "data: [DONE]\n\n"


def sse(body: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(body)}\n\n"


async def collect(deltas: AsyncIterator[Delta]) -> tuple[list[int], Delta]:
    """Every token of a request and its last delta (finish reason, cached tokens)."""
    tokens: list[int] = []
    async for delta in deltas:
        tokens += delta.token_ids
    return tokens, delta


async def unless_disconnected(request: Request, work: Awaitable) -> object:
    """Run `work` while watching the connection; if the client goes first, cancel `work` (which aborts its request,
    see AsyncEngine.stream) and return None. The body was read already, so the next message can only be the
    client's `http.disconnect`."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        gone = not task.done()
        if gone:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if gone else task.result()


def make_app(engine: Engine, tokenizer, model: str, after_step: Callable[[Finished], None] | None = None) -> FastAPI:
    """The app, serving `engine` under the name `model`. Its engine loop starts and stops with the app; after every
    pass it updates the metrics, then calls `after_step`."""
    served: Served | None = None
    metrics = EngineMetrics(engine, model)

    def observe(finished: Finished) -> None:
        metrics.update(finished)
        if after_step is not None:
            after_step(finished)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        nonlocal served
        served = Served(AsyncEngine(engine, observe), tokenizer, model)
        served.engine.start()
        app.state.served = served
        yield
        await served.engine.stop()

    app = FastAPI(title="kvcourse: chapter 7's server", lifespan=lifespan)

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, e: OpenAIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, e: RequestValidationError) -> JSONResponse:
        """FastAPI answers a body that fails its model with 422; OpenAI (and vLLM) with 400, naming the field."""
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p != "body") or None
        if first["type"] == "json_invalid":
            message, where = "the body is not valid JSON", None
        else:
            message = f"{where}: {first['msg']}"
        return JSONResponse(OpenAIError(400, message, param=where).body(), status_code=400)

    @app.exception_handler(EngineDead)
    async def dead(request: Request, e: EngineDead) -> JSONResponse:
        return JSONResponse(OpenAIError(503, str(e)).body(), status_code=503)

    @app.get("/health")
    async def health() -> JSONResponse:
        problem = served.engine.problem()
        return JSONResponse({"status": problem or "ok"}, status_code=503 if problem else 200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "kvcourse",
                                            "max_model_len": engine.model.config.max_position_embeddings}]}

    async def answer(request: Request, body: protocol.SamplingFields, ids: list[int], max_tokens: int | None,
                     default: int, chat: bool):
        """Queue the request, then answer it as one JSON body or as a stream of server-sent events. However the
        handler ends (finished, client gone, an error), the request is aborted if it still runs: `abort` of a
        finished request does nothing."""
        params = served.sampling(body, max_tokens, len(ids), default)
        rid = await served.add(ids, params)
        deltas = served.engine.stream(rid)  # at once: the request may finish in the next step
        name = protocol.request_id("chatcmpl" if chat else "cmpl")
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(served.events(deltas, name, len(ids), chat, include_usage),
                                     media_type="text/event-stream",
                                     background=BackgroundTask(served.engine.abort, rid))
        try:
            done = await unless_disconnected(request, collect(deltas))
        finally:
            served.engine.abort(rid)
        if done is None:  # the client is gone: nobody to answer
            return None
        tokens, last = done
        use = protocol.usage(len(ids), len(tokens), last.num_cached_tokens)
        build = protocol.chat_completion if chat else protocol.completion
        return build(name, model, served.text(tokens), last.finish_reason, use)

    @app.post("/v1/completions/render")
    async def render_completion(body: CompletionRequest) -> dict:
        """The prompt's token ids as the engine will see them, nothing queued: vLLM's render endpoints, which a
        router that hashes prompts into blocks itself (`vllm-router`'s `kv_aware`) asks before it routes."""
        served.check_model(body.model)
        return {"token_ids": tokenizer(body.prompt)["input_ids"] if isinstance(body.prompt, str) else body.prompt}

    @app.post("/v1/chat/completions/render")
    async def render_chat(body: ChatCompletionRequest) -> dict:
        served.check_model(body.model)
        return {"token_ids": chat_ids(tokenizer, [m.model_dump() for m in body.messages])}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        served.check_model(body.model)
        ids = tokenizer(body.prompt)["input_ids"] if isinstance(body.prompt, str) else body.prompt
        return await answer(request, body, ids, body.max_tokens, COMPLETION_DEFAULT_MAX_TOKENS, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        served.check_model(body.model)
        ids = chat_ids(tokenizer, [m.model_dump() for m in body.messages])
        return await answer(request, body, ids, body.max_completion_tokens or body.max_tokens,
                            CHAT_DEFAULT_MAX_TOKENS, chat=True)

    return app


@contextmanager
def running(app: FastAPI, port: int = 0, timeout_s: float = 30.0) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 from a background thread (port 0: any free one); yields the base URL, and stops the
    server (its engine loop with it) on exit. For the demo, the notebook and the tests."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start on 127.0.0.1:{port}")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
