"""The course's router: an OpenAI-compatible front for several replicas that sends each request where its prefix is
cached, as it learns from the replicas' KV events.

Per request: read the body, turn it into the token ids the replica will see (the same tokenizer and chat template),
name its full blocks by chapter 3's chain of hashes in their wire form, ask the policy (routing.py) for a replica,
and relay the replica's answer unchanged, as JSON or as a stream. Beside the requests, a thread reads every
replica's ZMQ event stream and hands the batches to the event loop, which applies them to that replica's
`CacheView`: all routing state is touched by the event loop alone.

Failures: a replica that refuses the connection, drops it, or answers 503 (its engine stopped) is marked down and
the request goes to another one; a JSON request can be retried until its answer is complete, a stream only until
its first byte (after that the client has part of an answer: the stream ends with an error event). A health check
brings a replica back once it answers `/health` again. With no replica left, the client gets OpenAI's error
envelope with 503.
"""
from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import httpx
import zmq
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from course.chat import chat_ids
from step03_prefix_hash import hash_token_blocks

from .kv_events import CacheView, KVCacheEvent, Subscriber, wire_hash
from .protocol import OpenAIError
from .routing import ReplicaState
from .server import sse, unless_disconnected

HEALTH_INTERVAL_S = 1.0


def prompt_hashes(tokenizer, path: str, body: dict, block_size: int) -> list[int]:
    """The wire hashes of the prompt's full blocks, as the replica will hash them; [] for a body the replica will
    refuse anyway (it answers the error, not the router)."""
    try:
        if path.endswith("chat/completions"):
            ids = chat_ids(tokenizer, body["messages"])
        else:
            prompt = body["prompt"]
            ids = tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else [int(t) for t in prompt]
    except Exception:  # noqa: BLE001 - a malformed body is the replica's to refuse
        return []
    return [wire_hash(h) for h in hash_token_blocks(ids, block_size)]


class Router:
    """Replicas (their URLs and event endpoints), a policy, and what the router knows of each replica."""

    def __init__(self, urls: Sequence[str], event_endpoints: Sequence[str | None], policy, tokenizer,
                 block_size: int) -> None:
        self.replicas = [ReplicaState(url) for url in urls]
        self.endpoints = list(event_endpoints)
        self.policy, self.tokenizer, self.block_size = policy, tokenizer, block_size
        self.lost_batches = 0  # event batches known lost (a sequence gap): that view was reset
        self.client: httpx.AsyncClient | None = None
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None

    # ---- KV events, read by a thread, applied on the event loop ------------------------------------------
    def start_listening(self, loop: asyncio.AbstractEventLoop) -> None:
        subs = {i: Subscriber(e) for i, e in enumerate(self.endpoints) if e is not None}
        self._listener = threading.Thread(target=self._listen, args=(subs, loop), name="kv-events", daemon=True)
        self._listener.start()

    def _listen(self, subs: dict[int, Subscriber], loop: asyncio.AbstractEventLoop) -> None:
        poller, index = zmq.Poller(), {}
        for i, sub in subs.items():
            poller.register(sub.socket, zmq.POLLIN)
            index[sub.socket] = i
        try:
            while not self._stop.is_set():
                for socket, _ in poller.poll(100):
                    i = index[socket]
                    try:
                        batches = subs[i].receive()
                    except RuntimeError:  # a gap: what the view holds is unknown; start again from empty
                        subs[i].next_seq = None
                        loop.call_soon_threadsafe(self._lost, i)
                        continue
                    loop.call_soon_threadsafe(self._apply, i, batches)
        finally:
            for sub in subs.values():
                sub.close()

    def _apply(self, i: int, batches: list[list[KVCacheEvent]]) -> None:
        view = self.replicas[i].view
        for events in batches:
            for event in events:
                view.apply(event)

    def _lost(self, i: int) -> None:
        self.lost_batches += 1
        self.replicas[i].view = CacheView()

    # ---- requests -----------------------------------------------------------------------------------------
    def choose(self, hashes: list[int]) -> int:
        try:
            return self.policy.choose(self.replicas, hashes)
        except LookupError:
            raise OpenAIError(503, "no replica is available") from None

    async def _send(self, path: str, content: bytes, hashes: list[int]) -> tuple[int, httpx.Response]:
        """Open the request on a replica the policy picks, moving on while replicas fail; (replica, response) with
        the response's body still unread. The replica's load counts the request until `_done`."""
        while True:
            index = self.choose(hashes)
            replica = self.replicas[index]
            replica.start(hashes)
            try:
                response = await self.client.send(
                    self.client.build_request("POST", replica.url + path, content=content,
                                              headers={"content-type": "application/json"}), stream=True)
            except httpx.TransportError:
                self._failed(index, hashes)
                continue
            except BaseException:  # cancelled: the client went away
                replica.finish(hashes)
                raise
            if response.status_code == 503:  # its engine stopped
                await response.aclose()
                self._failed(index, hashes)
                continue
            return index, response

    def _failed(self, index: int, hashes: list[int]) -> None:
        self.replicas[index].finish(hashes)
        self.replicas[index].healthy = False

    async def complete(self, path: str, content: bytes, hashes: list[int]) -> Response:
        """A JSON answer, read whole from the replica (so that a replica dying meanwhile costs a retry, not an
        error)."""
        while True:
            index, response = await self._send(path, content, hashes)
            try:
                body = await response.aread()
            except httpx.TransportError:
                self._failed(index, hashes)
                continue
            except BaseException:
                self.replicas[index].finish(hashes)
                raise
            finally:
                await response.aclose()
            self.replicas[index].finish(hashes)
            return Response(body, status_code=response.status_code,
                            media_type=response.headers.get("content-type"))

    async def stream(self, path: str, content: bytes, hashes: list[int]) -> Response:
        index, response = await self._send(path, content, hashes)
        done = False

        async def relay() -> AsyncIterator[bytes]:
            nonlocal done
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            except httpx.TransportError:  # the replica died mid-answer: the stream ends with an error event
                self.replicas[index].healthy = False
                yield sse(OpenAIError(503, "the replica serving this request stopped").body()).encode()
            finally:
                await response.aclose()
                if not done:
                    done = True
                    self.replicas[index].finish(hashes)

        async def close() -> None:  # also when the stream never started (the client left first)
            nonlocal done
            await response.aclose()
            if not done:
                done = True
                self.replicas[index].finish(hashes)

        return StreamingResponse(relay(), status_code=response.status_code,
                                 media_type=response.headers.get("content-type"), background=BackgroundTask(close))

    async def check_health(self) -> None:
        async def one(replica: ReplicaState) -> None:
            try:
                replica.healthy = (await self.client.get(replica.url + "/health", timeout=2.0)).status_code == 200
            except httpx.TransportError:
                replica.healthy = False
        await asyncio.gather(*(one(r) for r in self.replicas))

    async def watch_health(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            await self.check_health()

    def stop_listening(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.join(5)


def make_router(router: Router) -> FastAPI:
    """The router as an app: `/v1/completions` and `/v1/chat/completions` routed, `/v1/models` from a replica,
    `/health` ok while some replica is."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        router.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0),
                                          limits=httpx.Limits(max_connections=256))
        router.start_listening(asyncio.get_running_loop())
        health = asyncio.ensure_future(router.watch_health())
        yield
        health.cancel()
        router.stop_listening()
        await router.client.aclose()

    app = FastAPI(title="kvcourse: chapter 7's router", lifespan=lifespan)
    app.state.router = router

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, e: OpenAIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.get("/health")
    async def health() -> JSONResponse:
        up = sum(r.healthy for r in router.replicas)
        return JSONResponse({"status": "ok" if up else "no replica", "replicas_up": up},
                            status_code=200 if up else 503)

    @app.get("/v1/models")
    async def models() -> Response:
        for replica in router.replicas:
            if replica.healthy:
                try:
                    answer = await router.client.get(replica.url + "/v1/models")
                except httpx.TransportError:
                    continue
                return Response(answer.content, status_code=answer.status_code,
                                media_type=answer.headers.get("content-type"))
        raise OpenAIError(503, "no replica is available")

    async def route(request: Request, path: str) -> Response | None:
        content = await request.body()
        try:
            body = json.loads(content)
        except ValueError:
            body = None
        body = body if isinstance(body, dict) else {}
        hashes = prompt_hashes(router.tokenizer, path, body, router.block_size)
        if body.get("stream"):
            return await router.stream(path, content, hashes)
        return await unless_disconnected(request, router.complete(path, content, hashes))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await route(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await route(request, "/v1/chat/completions")

    return app
