"""AsyncEngine: chapter 2's synchronous engine, stepped in one loop beside the HTTP handlers.

The engine is not thread-safe and need not be: exactly one coroutine, the engine loop, touches it. Handlers never
call it; they put what they want into an inbox (add a request, abort one) and wait on a future or a queue. The loop
applies the inbox between steps, runs each `Engine.step()` in a worker thread (a forward takes milliseconds to
seconds; on the event loop it would freeze every connection), and hands each request's new tokens to its queue.
So a request is admitted, streamed and aborted while other requests keep decoding, and the engine's own code is
chapter 2's, unchanged. vLLM's `AsyncLLM` has the same shape with a process boundary in the middle (the engine core
runs in its own process and talks over ZMQ); SGLang splits tokenizer, scheduler and detokenizer into processes.

Nothing a slow client does can block the loop: a request's queue is unbounded (it holds at most `max_tokens`
deltas), and a request whose client went away is aborted, which gives its blocks back at once.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from step01_kvcache.request import SamplingParams
from step02_paged import Engine, RequestOutput


@dataclass(frozen=True)
class Delta:
    """What one step added to a request: its new token ids, and when it ended, why ("stop": a stop token, "length":
    `max_tokens` reached) and how many of its prompt tokens the prefix cache served."""

    token_ids: list[int]
    finish_reason: str | None = None
    num_cached_tokens: int = 0


class EngineDead(RuntimeError):
    """The engine loop stopped (shutdown, or a step raised): the request cannot go on."""


@dataclass
class _Stream:
    params: SamplingParams
    queue: asyncio.Queue
    sent: int = 0  # output tokens handed to the queue so far


Finished = list[tuple[RequestOutput, str]]  # the requests that ended in a pass of the loop, and why


class AsyncEngine:
    """Owns an `Engine`; `add` queues a request (a ValueError from the engine means nothing was queued), `stream`
    yields its deltas and aborts it if the consumer stops early. `after_step(finished)` runs in the loop after every
    pass (metrics, KV events), where reading the engine is safe; `finished` holds the requests that ended in the pass
    and why ("stop", "length" or "abort")."""

    def __init__(self, engine: Engine, after_step: Callable[[Finished], None] | None = None) -> None:
        self.engine = engine
        self._after_step = after_step or (lambda finished: None)
        self._finished: Finished = []
        self._inbox: deque[tuple] = deque()
        self._streams: dict[int, _Stream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._error: BaseException | None = None

    # ---- the handlers' side ------------------------------------------------------------------------------
    async def add(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """Queue a request between two steps; returns its id. Raises the engine's ValueError (nothing queued)."""
        self._check_alive()
        done = asyncio.get_running_loop().create_future()
        self._post(("add", prompt_ids, params, done))
        return await done

    def stream(self, request_id: int) -> AsyncIterator[Delta]:
        """The request's deltas until it finishes. Take it right after `add`, before anything else is awaited (a
        request may finish in the very next step). Leaving early (the client disconnected, the task was cancelled)
        aborts the request, so its blocks come back."""
        return self._deltas(request_id, self._streams[request_id])

    async def _deltas(self, request_id: int, stream: _Stream) -> AsyncIterator[Delta]:
        finished = False
        try:
            while not finished:
                delta = await stream.queue.get()
                if isinstance(delta, BaseException):
                    raise EngineDead(f"the engine stopped: {delta}") from delta
                finished = delta.finish_reason is not None
                yield delta
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: int) -> None:
        if request_id in self._streams:
            self._post(("abort", request_id))

    def _post(self, item: tuple) -> None:
        self._inbox.append(item)
        self._wake.set()

    def problem(self) -> str | None:
        """None while the engine loop runs; otherwise why it does not."""
        if self._task is None or self._task.done():
            return f"the engine loop is not running{f': {self._error}' if self._error else ''}"
        return None

    def _check_alive(self) -> None:
        if (problem := self.problem()) is not None:
            raise EngineDead(problem)

    # ---- the loop ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="engine-loop")

    async def stop(self) -> None:
        """Finish the step in flight, then abort every request left: a stopped engine holds no block."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._fail_all(EngineDead("the server is shutting down"))

    async def _loop(self) -> None:
        step: asyncio.Future | None = None
        try:
            while True:
                self._apply_inbox()
                self._after_step(self._finished)
                self._finished = []
                if not self.engine.has_unfinished():
                    self._wake.clear()
                    if not self._inbox:
                        await self._wake.wait()
                    continue
                step = asyncio.ensure_future(asyncio.to_thread(self.engine.step))
                self._deliver(await asyncio.shield(step))
                step = None
        except asyncio.CancelledError:
            if step is not None:  # never abort requests under a step that is still running in its thread
                await asyncio.wait([step])
            raise
        except Exception as e:  # a step raised: every live request fails, the loop is dead (as vLLM's engine)
            self._error = e
            self._fail_all(e)
            raise

    def _apply_inbox(self) -> None:
        while self._inbox:
            kind, *args = self._inbox.popleft()
            if kind == "add":
                prompt_ids, params, done = args
                if done.cancelled():
                    continue
                try:
                    rid = self.engine.add_request(prompt_ids, params)
                except ValueError as e:
                    done.set_exception(e)
                    continue
                self._streams[rid] = _Stream(params, asyncio.Queue())
                done.set_result(rid)
            elif kind == "abort" and args[0] in self._streams:
                del self._streams[args[0]]
                if args[0] in self.engine.seqs:
                    self._finished.append((self.engine.abort(args[0]), "abort"))

    def _deliver(self, finished: list[RequestOutput]) -> None:
        """Hand every live request the tokens the step added: O(live requests), from the sequences' own lists."""
        for out in finished:
            stream = self._streams.pop(out.seq_id, None)
            if stream is not None and not out.aborted:
                last = out.output_ids[-1] if out.output_ids else None
                reason = "stop" if last in stream.params.stop_token_ids else "length"
                stream.queue.put_nowait(Delta(out.output_ids[stream.sent:], reason, out.num_cached_tokens))
                self._finished.append((out, reason))
        for rid, stream in self._streams.items():
            ids = self.engine.seqs[rid].output_ids
            if len(ids) > stream.sent:
                stream.queue.put_nowait(Delta(ids[stream.sent:]))
                stream.sent = len(ids)

    def _fail_all(self, error: BaseException) -> None:
        """End every live request with `error` and abort it (no step is in flight: its blocks come back); refuse the
        requests still in the inbox."""
        for kind, *args in self._inbox:
            if kind == "add" and not args[-1].done():
                args[-1].set_exception(EngineDead(str(error)))
        self._inbox.clear()
        for rid, stream in self._streams.items():
            if rid in self.engine.seqs:
                self.engine.abort(rid)
            stream.queue.put_nowait(error)
        self._streams.clear()
