"""Pictures of chapter 7: the server around the engine (who runs where, what crosses between them), the KV events a
cache published, as text, replicas behind a router, and which replica held which tenant's prefix as a workload ran."""
from __future__ import annotations

from collections.abc import Callable

from course.draw import Dot, words
from step02_paged import PoolGeometry
from step02_paged.pictures import chat, run_step
from step03_prefix_hash import PrefixCachingKVCacheManager

from .cache_events import with_events
from .kv_events import BlockRemoved, BlockStored, EventLog, KVCacheEvent


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


def events_scenario() -> list[list[KVCacheEvent]]:
    """The lesson's events: chapter 3's cache over a pool of six 4-token blocks runs chapter 2's three chats (one
    alone, then two side by side) and a fourth without the system prompt; one batch per step that changed the cache.
    The pool is small, so the least recently used blocks are evicted, tail first."""
    log = EventLog()
    kv = with_events(PrefixCachingKVCacheManager, log)(PoolGeometry(6, 4))
    batches = []
    for requests in ([chat(kv, 0)], [chat(kv, 1), chat(kv, 2)], [chat(kv, 0, system=False)]):
        for step in range(min(len(answer) for _, answer in requests)):
            for seq, answer in requests:
                run_step(kv, seq, answer[step])
            if events := log.take():
                batches.append(events)
    return batches


def events_dot(batches: list[list[KVCacheEvent]], decode: Callable[[list[int]], str] | None = None,
               name: str = "events", width: int = 24) -> str:
    """Every block the events ever announced, drawn from the events alone as a router would rebuild them: a node per
    block hash (its tokens, the batch that stored it and the one that removed it; grey once removed), an edge from its
    parent's hash."""
    stored: dict[int, tuple[int | None, list[int], int]] = {}  # hash -> (parent, tokens, batch)
    removed: dict[int, int] = {}
    for n, batch in enumerate(batches):
        for event in batch:
            if isinstance(event, BlockStored):
                parent, bs = event.parent_block_hash, event.block_size
                for i, h in enumerate(event.block_hashes):
                    stored[h] = (parent, event.token_ids[i * bs:(i + 1) * bs], n)
                    removed.pop(h, None)
                    parent = h
            elif isinstance(event, BlockRemoved):
                removed.update((h, n) for h in event.block_hashes)
            else:
                removed.update((h, n) for h in stored if h not in removed)
    dot = Dot(name, rankdir="LR", nodesep="0.15", ranksep="0.3")
    dot.node("root", "root", shape="ellipse")
    for h, (parent, tokens, n) in stored.items():
        text = (decode(tokens) if decode else str(tokens)).replace("\n", " ")
        text = text if len(text) <= width else text[:width - 1] + "…"
        gone = h in removed
        label = f"#{h:016x}"[:5] + f"\n{text}\nstored: batch {n}" + (f"\nremoved: batch {removed[h]}" if gone else "")
        dot.node(f"h{h}", label, fillcolor="#e8eaed" if gone else "#ceead6", style="rounded,filled,dashed" if gone
                 else None, fontcolor="#5f6368" if gone else None)
        dot.edge("root" if parent is None else f"h{parent}", f"h{h}")
    return dot.source()


def routers_dot(name: str = "routers") -> str:
    """Replicas behind a router: requests flow down, each replica's KV events flow back up to the router, which keeps
    a view of every replica's cache (precise); a router without events keeps its own tree of what it sent where
    (approximate)."""
    dot = Dot(name, rankdir="TB", nodesep="0.3", ranksep="0.45")
    dot.node("clients", "clients (OpenAI API)", shape="oval", fillcolor="#e8f0fe")
    dot.raw('subgraph cluster_router { label="router (one process)"; style="rounded"; color="#888888";')
    dot.node("policy", "policy\nlongest cached prefix\nwithin a load bound", fillcolor="#fef7e0")
    dot.node("views", "a view per replica\nblocks from its events\n+ prompts it is running", shape="cylinder",
             fillcolor="#fef7e0")
    dot.raw("}")
    for i in range(3):
        dot.node(f"r{i}", f"replica {i}\nserver + engine\ncache (chapters 3-5)", fillcolor="#ceead6")
        dot.edge("policy", f"r{i}", "HTTP" if i == 0 else None)
        dot.edge(f"r{i}", "views", "KV events (ZMQ)" if i == 0 else None, style="dashed", color="#1a73e8",
                 constraint="false")
    dot.edge("clients", "policy", "POST /v1/chat/completions")
    dot.edge("views", "policy", "matched blocks, load", style="dotted")
    return dot.source()


def lesson_figures() -> dict[str, str]:
    """The figures of the lesson, by name."""
    return {"server": server_dot(), "events": events_dot(events_scenario(), words), "routers": routers_dot()}


TENANT_COLORS = ("#f4c7c3", "#c6dafc", "#b7e1cd", "#fce8b2", "#e1bee7", "#d7ccc8")


def placement_dot(requests: list[tuple[int, int, int]], held: list[list[set[int]]], name: str = "placement") -> str:
    """Which replica each request went to, and which tenants' prefixes every replica held after it. `requests`:
    (tenant, replica, cached prompt tokens) in arrival order; `held[i][r]`: the tenants whose whole shared prefix
    replica r held (from its KV events) after request i. A column per request: its replica's cell in the tenant's
    colour, bold when the prefix was served from the cache; each cell lists the tenants the replica held then."""
    def letter(t: int) -> str:
        return chr(ord("A") + t)

    def colour(t: int) -> str:
        return TENANT_COLORS[t % len(TENANT_COLORS)]

    replicas = len(held[0]) if held else 0
    rows = ['<TR><TD ALIGN="LEFT"><B>request</B></TD>' + "".join(
        f'<TD BGCOLOR="{colour(t)}">{letter(t)}</TD>' for t, _, _ in requests) + "</TR>"]
    for r in range(replicas):
        cells = []
        for (t, routed, cached), now in zip(requests, held):
            text = "".join(letter(x) for x in sorted(now[r])) or "-"
            if routed == r:
                cells.append(f'<TD BGCOLOR="{colour(t)}" BORDER="2">{f"<B>{text}</B>" if cached else text}</TD>')
            else:
                cells.append(f"<TD>{text}</TD>")
        rows.append(f'<TR><TD ALIGN="LEFT">replica {r}</TD>{"".join(cells)}</TR>')
    table = '<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="3">' + "".join(rows) + "</TABLE>"
    dot = Dot(name)
    dot.raw(f"placement [shape=plaintext, style=\"\", label=<{table}>];")
    return dot.source()


def events_text(batches: list[list[KVCacheEvent]], decode: Callable[[list[int]], str] | None = None,
                width: int = 60) -> str:
    """KV-event batches as lines: each event, its blocks' short hashes and parent, the text of stored blocks."""
    lines = []
    for n, batch in enumerate(batches):
        for event in batch:
            name = type(event).__name__
            if isinstance(event, BlockStored):
                text = decode(event.token_ids) if decode else str(event.token_ids)
                text = text.replace("\n", " ")
                lines.append(f"batch {n}: {name} {len(event.block_hashes)} x {event.block_size} tokens "
                             f"{_short(event.block_hashes)} after {_short([event.parent_block_hash])} "
                             f"{text[:width]!r}{'...' if len(text) > width else ''}")
            elif isinstance(event, BlockRemoved):
                lines.append(f"batch {n}: {name} {_short(event.block_hashes)}")
            else:
                lines.append(f"batch {n}: {name}")
    return "\n".join(lines)


def _short(hashes: list[int | None]) -> str:
    """Hashes as their first 4 hex digits (of 16), `root` for a first block's missing parent."""
    shown = ["root" if h is None else f"{h:016x}"[:4] for h in hashes[:3]]
    return "[" + ", ".join(shown) + (f", ... {len(hashes) - 3} more" if len(hashes) > 3 else "") + "]"
