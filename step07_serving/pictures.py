"""Pictures of chapter 7: the server around the engine (who runs where, what crosses between them)."""
from __future__ import annotations

from course.draw import Dot


def server_dot(name: str = "server") -> str:
    """The server's parts and what flows between them: the event loop runs the handlers and the engine loop; the
    engine's step runs in a worker thread; only the engine loop touches the engine."""
    dot = Dot(name, rankdir="LR", nodesep="0.25", ranksep="0.45")
    dot.node("clients", "clients\n(openai, curl, a router)", shape="oval", fillcolor="#e8f0fe")
    dot.raw('subgraph cluster_loop { label="the event loop (one thread)"; style="rounded"; color="#888888";')
    dot.node("handlers", "HTTP handlers\ncheck the body, tokenize,\nwait for deltas, stream SSE")
    dot.node("inbox", "inbox\nadd / abort", shape="cylinder", fillcolor="#fef7e0")
    dot.node("loop", "engine loop\napply the inbox, step,\nhand out new tokens")
    dot.node("queues", "one queue per request\n(deltas)", shape="cylinder", fillcolor="#fef7e0")
    dot.raw("}")
    dot.node("step", "Engine.step()\n(chapter 2, in a worker thread)", fillcolor="#ceead6")
    dot.node("cache", "cache manager\n(chapters 2-5)", fillcolor="#ceead6")
    dot.node("metrics", "/metrics\n(Prometheus text)", shape="note")
    dot.edge("clients", "handlers", "POST /v1/...")
    dot.edge("handlers", "inbox", "add, or abort on disconnect")
    dot.edge("inbox", "loop", "between steps")
    dot.edge("loop", "step", "one step at a time")
    dot.edge("step", "cache", "lookup, allocate, publish, free")
    dot.edge("loop", "queues", "new token ids")
    dot.edge("queues", "handlers", "deltas")
    dot.edge("handlers", "clients", "JSON, or server-sent events", style="dashed")
    dot.edge("loop", "metrics", "after every step", style="dotted")
    return dot.source()


def lesson_figures() -> dict[str, str]:
    """The figures of the lesson, by name."""
    return {"server": server_dot()}
