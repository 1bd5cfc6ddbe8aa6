"""Replicas as processes: N copies of `python -m step07_serving serve` on 127.0.0.1, each with its own engine, pool
and KV-event stream, started and always stopped together; and the routers of the field in front of them, as
processes too (`smg`, the Shepherd Model Gateway that grew out of SGLang's router, and `vllm-router`).

Each replica binds any free port (HTTP and ZMQ) and prints where; its output goes to a log file, which is where the
parent reads those addresses (a pipe nobody drains would block a chatty server). A replica runs in its own process
group, so that stopping it stops everything it started, and on Linux it is told to die with the thread that started
it (`PR_SET_PDEATHSIG`): a test run killed at its timeout leaves no server behind. `replicas(...)` is a context
manager: however its body ends, every process it started is terminated, then killed if it lingers, then reaped.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HOST = "127.0.0.1"
_URL = re.compile(r"serving .* on (http://\S+)/v1")
_EVENTS = re.compile(r"KV events on (tcp://\S+),")

try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork
except (OSError, AttributeError):  # not Linux: no parent-death signal, the context manager alone stops children
    _prctl = None


def _die_with_parent() -> None:
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    """A process the cluster started, and the log its output goes to."""

    name: str
    process: subprocess.Popen
    log: Path
    url: str | None = None
    events: str | None = None
    _file: object = field(default=None, repr=False)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def spawn(name: str, command: Sequence[str], logdir: Path, env: dict[str, str] | None = None) -> Child:
    """Start `command` in its own process group, its output into `logdir/name.log`."""
    log = Path(logdir) / f"{name}.log"
    out = open(log, "wb")
    process = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True, preexec_fn=_die_with_parent,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    return Child(name, process, log, _file=out)


def stop(child: Child, grace_s: float = 10.0) -> None:
    """SIGTERM to the child's process group (uvicorn shuts down cleanly on it), SIGKILL after `grace_s`, then reap."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            child.process.wait(grace_s)
            break
        except subprocess.TimeoutExpired:
            continue
    child.process.wait()
    try:
        os.killpg(child.process.pid, signal.SIGKILL)  # anything the child left in its group
    except (ProcessLookupError, PermissionError):
        pass
    child._file.close()


def wait_healthy(child: Child, deadline: float, url: str | None = None) -> None:
    """Until `url/health` answers 200; raises with the child's log if it exits or the deadline passes."""
    url = url or child.url
    while True:
        if child.process.poll() is not None:
            raise RuntimeError(f"{child.name} exited with {child.process.returncode}:\n{child.log_tail()}")
        if url is not None:
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{child.name} did not become healthy in time:\n{child.log_tail()}")
        time.sleep(0.1)


def _read_addresses(child: Child) -> None:
    text = child.log_tail(100_000)
    if child.url is None and (m := _URL.search(text)):
        child.url = m.group(1)
    if child.events is None and (m := _EVENTS.search(text)):
        child.events = m.group(1)


def replica_command(serve_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "step07_serving", "serve", "--host", HOST, "--port", "0", "--kv-events-port", "0",
            "--log-level", "warning", *serve_args]


@contextmanager
def replicas(n: int, serve_args: Sequence[str], logdir: Path, threads: int | None = None,
             timeout_s: float = 180.0) -> Iterator[list[Child]]:
    """`n` replicas serving with `serve_args` (the engine and model options of `serve`), each with `threads` torch
    threads; yields them once every one answers `/health`, and stops them all however the block ends."""
    env = {"OMP_NUM_THREADS": str(threads)} if threads else None
    children: list[Child] = []
    try:
        for i in range(n):
            children.append(spawn(f"replica-{i}", replica_command(serve_args), logdir, env))
        deadline = time.monotonic() + timeout_s
        for child in children:
            while _read_addresses(child) is None and (child.url is None or child.events is None):
                if child.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{child.name} did not start:\n{child.log_tail()}")
                time.sleep(0.1)
            wait_healthy(child, deadline)
        yield children
    finally:
        for child in children:
            stop(child)


def free_port() -> int:
    """A port of 127.0.0.1 that nobody listens on now, for a program that cannot pick its own (port 0)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def program(name: str) -> str:
    """The path of a command installed with the course's packages (beside this Python), or on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"`{name}` is not installed: pip install the course's `serve` extra")
    return found


SMG_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")


def smg_command(port: int, metrics_port: int, worker_urls: Sequence[str], policy: str) -> list[str]:
    """`smg launch` in front of OpenAI-compatible workers, every port on 127.0.0.1 (its metrics bind 0.0.0.0 unless
    told otherwise). Over HTTP its `cache_aware` keeps an approximate radix tree of the request texts it routed, per
    worker, with no events; it needs no tokenizer."""
    return [program("smg"), "launch", "--host", HOST, "--port", str(port), "--worker-urls", *worker_urls,
            "--policy", policy, "--prometheus-host", HOST, "--prometheus-port", str(metrics_port),
            "--disable-tokenizer-autoload", "--log-level", "warn"]


@contextmanager
def fronting(name: str, command: Sequence[str], port: int, logdir: Path, timeout_s: float = 60.0) -> Iterator[Child]:
    """A router process listening on `port` of 127.0.0.1; yields it (`.url`) once it answers `/health`, and stops it
    however the block ends (it holds no state: no need to wait out its drain window)."""
    child = spawn(name, command, logdir)
    child.url = f"http://{HOST}:{port}"
    try:
        wait_healthy(child, time.monotonic() + timeout_s)
        yield child
    finally:
        stop(child, grace_s=0.5)


def smg(worker_urls: Sequence[str], policy: str, logdir: Path, port: int = 0):
    """`smg` routing to `worker_urls` with `policy`, as a context manager yielding its process (`.url`)."""
    port = port or free_port()
    return fronting(f"smg-{policy}", smg_command(port, free_port(), worker_urls, policy), port, logdir)


VLLM_ROUTER_POLICIES = ("kv_aware", "cache_aware", "round_robin", "power_of_two")


def vllm_router_command(port: int, metrics_port: int, workers: Sequence[Child], policy: str, model: str,
                        block_size: int) -> list[str]:
    """`vllm-router` in front of the replicas; with `kv_aware`, each replica's KV-event endpoint as its static event
    source. Before routing, `kv_aware` asks a replica to render the prompt into token ids
    (`/v1/chat/completions/render`), then prices each replica by the blocks it would have to prefill there."""
    command = [program("vllm-router"), "--host", HOST, "--port", str(port), "--worker-urls",
               *[w.url for w in workers], "--policy", policy, "--prometheus-host", HOST,
               "--prometheus-port", str(metrics_port), "--log-level", "warning"]
    if policy == "kv_aware":
        command += ["--kv-event-block-size", str(block_size), "--kv-event-model", model]
        for w in workers:
            command += ["--kv-event-source", f"{w.url}={w.events}"]
    return command


def vllm_router(workers: Sequence[Child], policy: str, logdir: Path, model: str, block_size: int = 16,
                port: int = 0):
    """`vllm-router` in front of `workers` with `policy`, as a context manager yielding its process (`.url`)."""
    port = port or free_port()
    command = vllm_router_command(port, free_port(), workers, policy, model, block_size)
    return fronting(f"vllm-router-{policy}", command, port, logdir)
