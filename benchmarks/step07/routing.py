"""`python -m benchmarks.step07.routing [--save]`: a multi-tenant workload through each router in front of the same
replicas of the real model; writes results/routing.json.

Four tenants, each with its own long system prompt (a document of ~190 tokens: the `multi_doc` workload's), and
many users, each asking one short question of one tenant (drawn at random, seeded, so that no router's turns line up
with the tenants by chance); short answers. Clients stream their chats through the router, a few at once, in arrival
order. Every run starts fresh replicas (empty caches), so each router meets the same workload on the same machines.

Routing only matters when a replica cannot keep every tenant's prefix: each replica's pool is sized to hold the
prefixes of the tenants a cache-aware router would give it (tenants / replicas) plus its running requests, as a
production replica is sized to its GPU; then the same workload with pools eight times larger, where every replica
keeps every prefix and round robin too misses only once per tenant per replica.

Per run it records what the clients saw (time to the first token, cached prompt tokens from the usage, the text),
the wall time, and per replica the requests it served. Greedy answers must be the same whichever replica serves them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from course import results
from course.chat import chat, chat_ids
from course.tokenizer import load_tokenizer
from course.workloads import TEXTS
from step01_kvcache.pretrained import DEFAULT_MODEL
from step07_serving.cluster import replicas, smg, vllm_router
from step07_serving.router import Router, make_router
from step07_serving.routing import POLICIES
from step07_serving.server import running

REPLICAS = 4  # one torch thread each: on a two-core machine they share the cores
TENANTS = 4
USERS = 32
CONCURRENCY = 4  # clients streaming at once
NEW_TOKENS = 16
MAX_NUM_SEQS = 2  # requests a replica runs at once
BLOCK_SIZE = 16
LARGE = 8  # the larger pools' factor
ROUTERS = (("course", "cache_aware"), ("smg", "cache_aware"), ("vllm-router", "kv_aware"), ("course", "round_robin"),
           ("smg", "round_robin"))


def workload(users: int = USERS, seed: int = 0) -> list[tuple[int, list[dict]]]:
    """(tenant, chat) per user, in arrival order: each user asks one of its tenant's questions, as a ticket of its
    own (so no two users send the same prompt)."""
    docs = json.loads((TEXTS / "multi_doc.json").read_text(encoding="utf-8"))[:TENANTS]
    rng = random.Random(seed)
    out = []
    for u in range(users):
        t = rng.randrange(TENANTS)
        out.append((t, chat(f"Ticket {1000 + u}: {docs[t]['questions'][u % 3]}", docs[t]["document"])))
    return out


def pool_blocks(tok, chats: list[tuple[int, list[dict]]], num_replicas: int = REPLICAS) -> dict:
    """The small pool: the full blocks of `TENANTS / num_replicas` tenants' shared prefixes plus `MAX_NUM_SEQS` running
    requests' own blocks (prompt past the prefix, and the answer), plus one block of slack."""
    ids = [(t, chat_ids(tok, c)) for t, c in chats]
    shared = {}
    for t in range(TENANTS):
        mine = [p for tt, p in ids if tt == t]
        n = min(len(p) for p in mine)
        while any(p[:n] != mine[0][:n] for p in mine):
            n -= 1
        shared[t] = n // BLOCK_SIZE
    own = max(-(-(len(p) + NEW_TOKENS) // BLOCK_SIZE) - shared[t] for t, p in ids)
    per_replica = -(-TENANTS // num_replicas)
    small = per_replica * max(shared.values()) + MAX_NUM_SEQS * own + 1
    return dict(shared_prefix_blocks=[shared[t] for t in range(TENANTS)], own_blocks_max=own, small=small,
                prompt_tokens=[len(p) for _, p in ids])


async def _clients(url: str, chats: list[tuple[int, list[dict]]]) -> list[dict]:
    """`CONCURRENCY` clients taking the chats in order; per chat: time to the first token, usage, text, the end."""
    queue: asyncio.Queue = asyncio.Queue()
    for i, item in enumerate(chats):
        queue.put_nowait((i, *item))
    out: list[dict | None] = [None] * len(chats)
    start = time.perf_counter()

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i, tenant, messages = queue.get_nowait()
            body = {"model": DEFAULT_MODEL, "messages": messages, "max_tokens": NEW_TOKENS, "temperature": 0,
                    "stream": True, "stream_options": {"include_usage": True}}
            sent, first, text, use = time.perf_counter(), None, [], None
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    for choice in chunk["choices"]:
                        if "content" in choice["delta"] and "role" not in choice["delta"] or choice["finish_reason"]:
                            first = first or time.perf_counter() - sent
                        text.append(choice["delta"].get("content") or "")
                    use = chunk.get("usage") or use
            out[i] = dict(tenant=tenant, ttft_s=first, text="".join(text), prompt_tokens=use["prompt_tokens"],
                          cached_tokens=use["prompt_tokens_details"]["cached_tokens"],
                          completion_tokens=use["completion_tokens"], end_s=time.perf_counter() - start)

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await asyncio.gather(*(client(http) for _ in range(CONCURRENCY)))
    return out


def served_per_replica(children) -> list[int]:
    counts = []
    for child in children:
        lines = httpx.get(f"{child.url}/metrics").text.splitlines()
        counts.append(int(sum(float(x.split()[-1]) for x in lines if x.startswith("vllm:request_success_total"))))
    return counts


@contextmanager
def fronted(kind: str, policy: str, children, tok, logdir: Path):
    """The base URL of `kind`'s router with `policy` in front of `children`."""
    if kind == "smg":
        with smg([c.url for c in children], policy, logdir) as router:
            yield router.url
    elif kind == "vllm-router":
        with vllm_router(children, policy, logdir, DEFAULT_MODEL, BLOCK_SIZE) as router:
            yield router.url
    else:
        router = Router([c.url for c in children], [c.events for c in children], POLICIES[policy](), tok,
                        BLOCK_SIZE)
        with running(make_router(router)) as url:
            yield url


def run(kind: str, policy: str, num_replicas: int, num_blocks: int, chats, tok, logdir: Path) -> dict:
    args = ["--prefix-cache", "hash", "--block-size", str(BLOCK_SIZE), "--num-blocks", str(num_blocks),
            "--max-num-seqs", str(MAX_NUM_SEQS), "--log-level", "warning"]
    with replicas(num_replicas, args, logdir, threads=1) as children, \
            fronted(kind, policy, children, tok, logdir) as url:
        start = time.perf_counter()
        answers = asyncio.run(_clients(url, chats))
        wall = time.perf_counter() - start
        per_replica = served_per_replica(children)
    prompt = sum(a["prompt_tokens"] for a in answers)
    cached = sum(a["cached_tokens"] for a in answers)
    ttft = sorted(a["ttft_s"] for a in answers)
    row = dict(router=kind, policy=policy, num_blocks=num_blocks, prompt_tokens=prompt, cached_tokens=cached,
               hit_rate=round(cached / prompt, 4), computed_prompt_tokens=prompt - cached,
               ttft_p50_s=round(statistics.median(ttft), 4),
               ttft_p99_s=round(ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))], 4),
               wall_s=round(wall, 2), tokens_per_s=round(sum(a["completion_tokens"] for a in answers) / wall, 2),
               served_per_replica=per_replica,
               texts=[a["text"] for a in answers],
               requests=[dict(tenant=a["tenant"], ttft_s=round(a["ttft_s"], 4), cached_tokens=a["cached_tokens"])
                         for a in answers])
    print(json.dumps({k: v for k, v in row.items() if k not in ("texts", "requests")}), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step07.routing", description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=USERS)
    p.add_argument("--replicas", type=int, default=REPLICAS)
    p.add_argument("--routers", default=",".join(f"{k}:{pol}" for k, pol in ROUTERS),
                   help="comma-separated router:policy (routers: course, smg, vllm-router)")
    p.add_argument("--pools", default="small,large", help="small (about the cache-aware share of prefixes), large")
    p.add_argument("--save", action="store_true", help="write step07_serving/results/routing.json")
    args = p.parse_args(argv)
    meta = results.started("python -m benchmarks.step07.routing --save")
    tok = load_tokenizer()
    chats = workload(args.users)
    sizing = pool_blocks(tok, chats, args.replicas)
    pools = {"small": sizing["small"], "large": LARGE * sizing["small"]}
    runs = []
    with tempfile.TemporaryDirectory(prefix="kvcourse-routing-") as logdir:
        for pool in args.pools.split(","):
            for spec in args.routers.split(","):
                kind, policy = spec.split(":")
                runs.append(dict(pool=pool, **run(kind, policy, args.replicas, pools[pool], chats, tok, Path(logdir))))
    same = all(r["texts"] == runs[0]["texts"] for r in runs)
    differing = sorted({i for r in runs for i, t in enumerate(r["texts"]) if t != runs[0]["texts"][i]})
    for r in runs:
        r.pop("texts")
    figures = dict(replicas=args.replicas, tenants=TENANTS, users=args.users, concurrency=CONCURRENCY,
                   new_tokens=NEW_TOKENS, max_num_seqs=MAX_NUM_SEQS, block_size=BLOCK_SIZE, large_factor=LARGE,
                   pools=pools, sizing={k: v for k, v in sizing.items() if k != "small"},
                   tenant_of_request=[t for t, _ in chats], runs=runs, outputs_identical=same,
                   requests_with_other_answers=differing)
    if args.save:
        print(f"wrote {results.save('step07', 'routing', figures, meta)}")
    print(json.dumps({k: v for k, v in figures.items() if k not in ("runs", "tenant_of_request", "sizing")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
