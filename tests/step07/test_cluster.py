"""Replicas as processes behind the course's router, `smg` and `vllm-router`: round robin takes turns, a cache-aware
policy keeps each prefix on one replica (and so serves it from the cache), the answers are the replicas' own, every
process binds 127.0.0.1 only, and every process is reaped however the block that started it ends.

The replicas serve the tiny random model, saved as a checkpoint folder with the real tokenizer; their pools are
small (64 blocks of 16). Each test uses prompts of its own, so the replicas' caches never carry one test's prefixes
into another's counts."""
from __future__ import annotations

import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from safetensors.torch import save_file

from course.chat import chat_ids
from step01_kvcache.hf import to_hf_config, to_hf_state_dict
from step07_serving import running
from step07_serving.cluster import replicas, smg, vllm_router
from step07_serving.router import Router, make_router, prompt_hashes
from step07_serving.routing import CacheAware, RoundRobin

from .conftest import MODEL

pytestmark = pytest.mark.timeout(120)

BLOCK_SIZE = 16


def save_checkpoint(model, tokenizer, folder: Path) -> Path:
    """`model` as a Hugging Face checkpoint folder, with `tokenizer`: what `serve --model` reads."""
    folder.mkdir(parents=True, exist_ok=True)
    to_hf_config(model.config).save_pretrained(folder)
    state = to_hf_state_dict(model.state_dict())
    save_file({k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"}, str(folder / "model.safetensors"))
    tokenizer.save_pretrained(folder)
    return folder


def serve_args(checkpoint: Path, num_blocks: int = 64) -> list[str]:
    return ["--model", str(checkpoint), "--served-model-name", MODEL, "--prefix-cache", "hash",
            "--num-blocks", str(num_blocks), "--max-num-seqs", "4"]


@pytest.fixture(scope="module")
def checkpoint(model, tokenizer, tmp_path_factory) -> Path:
    return save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("tiny") / "checkpoint")


@pytest.fixture(scope="module")
def two(checkpoint, tmp_path_factory):
    """Two replica processes, one torch thread each; stopped and reaped when the module ends, pass or fail."""
    with replicas(2, serve_args(checkpoint), tmp_path_factory.mktemp("logs"), threads=1) as children:
        yield children


@contextmanager
def routed(children, policy, tokenizer):
    """The course's router in front of `children`, in a thread of this process; yields (URL, Router)."""
    router = Router([c.url for c in children], [c.events for c in children], policy, tokenizer, BLOCK_SIZE)
    with running(make_router(router)) as url:
        yield url, router


def complete(url: str, prompt: list[int], max_tokens: int = 3) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def settle(router: Router, hashes: list[int], timeout_s: float = 10.0) -> None:
    """Until some replica's events have told the router about the prompt's blocks (they travel beside the answer)."""
    deadline = time.monotonic() + timeout_s
    while not any(all(h in r.view.blocks for h in hashes) for r in router.replicas):
        assert time.monotonic() < deadline, "the KV events of an answered prompt never arrived"
        time.sleep(0.01)


def tenants(base: int, n: int = 3, users: int = 3) -> list[list[int]]:
    """`users` rounds over `n` tenants: each prompt is its tenant's 48-token system prefix (three full blocks), then
    a few tokens of its own; in the order they arrive (A1 B1 C1 A2 B2 C2 ...)."""
    return [list(range(base + 100 * t, base + 100 * t + 48)) + [base + 90 + u, 7, 8, 9]
            for u in range(users) for t in range(n)]


def run(url: str, router: Router, prompts: list[list[int]], tokenizer) -> list[tuple[int, int, str]]:
    """(replica index, cached prompt tokens, text) of each prompt, sent one after another."""
    out = []
    for prompt in prompts:
        before = [r.routed for r in router.replicas]
        answer = complete(url, prompt)
        settle(router, prompt_hashes(tokenizer, "/v1/completions", {"prompt": prompt}, BLOCK_SIZE))
        [index] = [i for i, r in enumerate(router.replicas) if r.routed > before[i]]
        out.append((index, answer["usage"]["prompt_tokens_details"]["cached_tokens"], answer["choices"][0]["text"]))
    return out


def test_round_robin_takes_turns_and_answers_as_a_replica_does(two, tokenizer):
    prompts = tenants(10_000)
    with routed(two, RoundRobin(), tokenizer) as (url, router):
        served = run(url, router, prompts, tokenizer)
        assert [i for i, _, _ in served] == [0, 1] * 4 + [0]
        assert [r.in_flight for r in router.replicas] == [0, 0] and not any(r.running for r in router.replicas)
    # each tenant's prefix is computed once on each replica: six misses, then three hits of its 48 system tokens
    assert [cached for _, cached, _ in served] == [0] * 6 + [48] * 3
    # greedy: the same tokens wherever they are served, through the router or not
    direct = [complete(two[1].url, p)["choices"][0]["text"] for p in prompts[:3]]
    assert [text for _, _, text in served[:3]] == direct


def test_cache_aware_keeps_each_prefix_on_one_replica(two, tokenizer):
    aware_prompts, blind_prompts = tenants(20_000), tenants(30_000)
    with routed(two, CacheAware(), tokenizer) as (url, router):
        aware = run(url, router, aware_prompts, tokenizer)
        views = [set(r.view.blocks) for r in router.replicas]
    with routed(two, RoundRobin(), tokenizer) as (url, router):
        blind = run(url, router, blind_prompts, tokenizer)
    for t in range(3):
        assert len({aware[i][0] for i in range(t, 9, 3)}) == 1, f"tenant {t} was split over replicas"
        assert len({blind[i][0] for i in range(t, 9, 3)}) == 2
        system = prompt_hashes(tokenizer, "/v1/completions", {"prompt": aware_prompts[t]}, BLOCK_SIZE)[:3]
        assert sum(set(system) <= view for view in views) == 1  # the events say so too
    assert {i for i, _, _ in aware[:3]} == {0, 1}  # new prefixes spread
    # every repeat of a tenant's prompt finds its three system blocks; round robin misses on each new replica
    assert [cached for _, cached, _ in aware] == [0] * 3 + [48] * 6
    assert sum(cached for _, cached, _ in blind) == 48 * 3


def listening(pid: int) -> set[str]:
    """The local addresses of the TCP sockets that process `pid` listens on (Linux /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in open(f"/proc/{pid}/net/{table}").readlines()[1:]:
            fields = line.split()
            if fields[9] in inodes and fields[3] == "0A":  # LISTEN
                raw = bytes.fromhex(fields[1].split(":")[0])
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(family, words))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads sockets from Linux's /proc")
def test_every_replica_listens_on_loopback_only(two):
    for child in two:
        assert listening(child.process.pid) == {"127.0.0.1"}, child.name


def finished_requests(url: str) -> float:
    """Requests the replica has finished since it started, from its `/metrics`."""
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith("vllm:request_success_total"))


def chats(tag: str, n: int = 3, users: int = 3) -> list[list[dict]]:
    """`users` rounds over `n` tenants, as chats: a long system prompt per tenant (different from its first words,
    as an approximate router over text needs), then each user's own question."""
    return [[{"role": "system", "content": f"{tag} tenant {t}: " + "You answer questions about the course. " * 5},
             {"role": "user", "content": f"Question {u}: what is a block?"}] for u in range(users) for t in range(n)]


def through(url: str, children, prompts: list[list[dict]]) -> list[tuple[int, int, str]]:
    """(replica index, cached prompt tokens, text) of each chat sent to `url` one after another; the replica is the
    one whose count of finished requests grew (any router: nothing is asked of it)."""
    out = []
    for messages in prompts:
        before = [finished_requests(c.url) for c in children]
        body = {"model": MODEL, "messages": messages, "max_tokens": 3, "temperature": 0}
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        [index] = [i for i, c in enumerate(children) if finished_requests(c.url) > before[i]]
        answer = answer.json()
        out.append((index, answer["usage"]["prompt_tokens_details"]["cached_tokens"],
                    answer["choices"][0]["message"]["content"]))
    return out


def test_smg_round_robin_spreads_and_cache_aware_keeps_each_prefix_on_one_replica(two, tmp_path):
    served, cached = {}, {}
    for policy in ("round_robin", "cache_aware"):
        prompts = chats(policy)
        with smg([c.url for c in two], policy, tmp_path) as router:
            assert listening(router.process.pid) == {"127.0.0.1"}  # its metrics too
            served[policy] = through(router.url, two, prompts)
        cached[policy] = sum(c for _, c, _ in served[policy][3:])
        direct = httpx.post(f"{two[0].url}/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": prompts[0], "max_tokens": 3, "temperature": 0}).json()
        assert served[policy][0][2] == direct["choices"][0]["message"]["content"]
    for t in range(3):
        assert len({served["round_robin"][i][0] for i in range(t, 9, 3)}) == 2, f"round robin kept tenant {t}"
        assert len({served["cache_aware"][i][0] for i in range(t, 9, 3)}) == 1, f"cache_aware split tenant {t}"
    assert cached["cache_aware"] > cached["round_robin"]


def test_vllm_router_kv_aware_renders_through_the_replicas_and_answers_as_they_do(two, tmp_path, tokenizer):
    """kv_aware asks a replica for the prompt's token ids (`/v1/chat/completions/render`, nothing queued) and reads
    the replicas' events; it does not credit their blocks (it hashes prompts the way vLLM does, chapter 3's hash is
    not among its schemes), so it routes by load, and every answer is still the replicas' own."""
    prompts = chats("vllm-router")
    rendered = httpx.post(f"{two[0].url}/v1/chat/completions/render", json={"model": MODEL, "messages": prompts[0]})
    assert rendered.json() == {"token_ids": chat_ids(tokenizer, prompts[0])}
    with vllm_router(two, "kv_aware", tmp_path, MODEL, BLOCK_SIZE) as router:
        assert listening(router.process.pid) == {"127.0.0.1"}
        served = through(router.url, two, prompts[:3])
    direct = [httpx.post(f"{two[1].url}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": p, "max_tokens": 3, "temperature": 0}).json() for p in prompts[:3]]
    assert [text for _, _, text in served] == [d["choices"][0]["message"]["content"] for d in direct]


def test_replicas_are_reaped_when_the_block_fails(checkpoint, tmp_path):
    with pytest.raises(ZeroDivisionError), replicas(1, serve_args(checkpoint), tmp_path, threads=1) as [child]:
        port = int(child.url.rsplit(":", 1)[1])
        assert httpx.get(f"{child.url}/health").status_code == 200
        raise ZeroDivisionError("the block fails")
    assert child.process.returncode is not None  # exited and reaped
    with pytest.raises(ProcessLookupError):
        os.killpg(child.process.pid, 0)  # nothing of its process group is left
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
