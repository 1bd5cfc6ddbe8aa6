"""`python -m step07_serving`: the real model behind the OpenAI-compatible server, asked through the `openai` client:
twice as JSON (the second time the prefix cache serves the prompt), then once more as a stream.
`python -m step07_serving serve --port P` serves it until interrupted; `python -m step07_serving cluster --replicas N`
serves N replicas behind a router."""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path

import uvicorn

from course.chat import chat
from course.tokenizer import load_tokenizer
from step01_kvcache.demo import demo_parser
from step01_kvcache.pretrained import DEFAULT_MODEL, timed_load
from step02_paged import Engine, EngineConfig

from .cache_events import DESIGNS, cached_blocks, with_events
from .cluster import HOST, SMG_POLICIES, VLLM_ROUTER_POLICIES, replicas, smg, vllm_router
from .kv_events import CacheView, EventLog, ZmqPublisher
from .pictures import events_text
from .router import Router, make_router
from .routing import POLICIES
from .server import make_app, running

POOL_TOKENS = 8192  # the pool's size in tokens, as the other chapters' demos size it


def engine_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--prefix-cache", default="bridge", choices=list(DESIGNS),
                        help="the cache manager: none (chapter 2), hash (3), radix (4), bridge (5; the default)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (the radix cache uses 1)")
    parser.add_argument("--max-num-seqs", type=int, default=8, help="requests running at once")
    parser.add_argument("--num-blocks", type=int, default=None,
                        help=f"blocks in the KV pool (default: {POOL_TOKENS} tokens' worth; vLLM's "
                             "--num-gpu-blocks-override)")
    return parser


def make_engine(model, args: argparse.Namespace, log: EventLog) -> Engine:
    """The engine the options describe, its cache reporting KV events to `log`; the radix cache stores one token per
    slot."""
    block_size = 1 if args.prefix_cache == "radix" else args.block_size
    config = EngineConfig(num_blocks=args.num_blocks or POOL_TOKENS // max(1, block_size), block_size=block_size,
                          max_num_seqs=args.max_num_seqs)
    return Engine(model, config, with_events(DESIGNS[args.prefix_cache], log))


def serve(argv: list[str]) -> int:
    parser = engine_options(argparse.ArgumentParser(prog="python -m step07_serving serve",
                                                    description="serve the model until interrupted"))
    parser.add_argument("--port", type=int, default=8000, help="the HTTP port (0: any free one, printed)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (default: this machine only)")
    parser.add_argument("--model", default=None, help="a checkpoint folder or .gguf file (default: SmolLM2)")
    parser.add_argument("--served-model-name", default=DEFAULT_MODEL, help="the name clients ask for")
    parser.add_argument("--log-level", default="info", help="uvicorn's (warning: no line per request)")
    parser.add_argument("--kv-events-port", type=int, default=None,
                        help="publish KV-cache events in vLLM's format on this ZMQ PUB port (0: any free one, "
                             "printed; default: none)")
    args = parser.parse_args(argv)
    model, tok, load_s = timed_load(args.model)
    log = EventLog()
    try:
        engine = make_engine(model, args, log)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sock = socket.create_server((args.host, args.port))  # bound here, so that port 0 is known before serving
    url = f"http://{args.host}:{sock.getsockname()[1]}"
    print(f"model loaded in {load_s:.1f} s; {args.prefix_cache} cache, {engine.config.num_blocks} blocks of "
          f"{engine.config.block_size}; serving {args.served_model_name!r} on {url}/v1", flush=True)
    publisher = None
    if args.kv_events_port is not None:
        publisher = ZmqPublisher(f"tcp://{args.host}:{args.kv_events_port or '*'}")
        print(f"KV events on {publisher.endpoint}, topic {publisher.topic.decode()!r}", flush=True)
    after_step = (lambda finished: publisher.publish(log.take())) if publisher else (lambda finished: log.take())
    app = make_app(engine, tok, args.served_model_name, after_step)
    try:
        uvicorn.Server(uvicorn.Config(app, log_level=args.log_level)).run(sockets=[sock])
    finally:
        sock.close()
        if publisher is not None:
            publisher.close()
    return 0


def replica_args(args: argparse.Namespace) -> list[str]:
    """The options of `serve` that make a replica as `args` describe it."""
    out = ["--prefix-cache", args.prefix_cache, "--block-size", str(args.block_size), "--max-num-seqs",
           str(args.max_num_seqs), "--served-model-name", args.served_model_name]
    out += ["--num-blocks", str(args.num_blocks)] if args.num_blocks else []
    return out + (["--model", args.model] if args.model else [])


def cluster(argv: list[str]) -> int:
    parser = engine_options(argparse.ArgumentParser(
        prog="python -m step07_serving cluster",
        description="N replicas of the server and a router in front of them, on 127.0.0.1, until interrupted"))
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--router", default="course", choices=["course", "smg", "vllm-router"],
                        help="which router fronts the replicas: the course's (KV events), smg (its own tree) or "
                             "vllm-router")
    parser.add_argument("--policy", default="cache_aware",
                        choices=sorted({*POLICIES, *SMG_POLICIES, *VLLM_ROUTER_POLICIES}),
                        help=f"the router's policy (the course's: {', '.join(POLICIES)})")
    parser.add_argument("--port", type=int, default=8000, help="the router's port")
    parser.add_argument("--model", default=None, help="a checkpoint folder or .gguf file (default: SmolLM2)")
    parser.add_argument("--served-model-name", default=DEFAULT_MODEL, help="the name clients ask for")
    parser.add_argument("--threads-per-replica", type=int, default=None,
                        help="torch threads in each replica (default: the cores shared out)")
    args = parser.parse_args(argv)
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    offered = {"course": POLICIES, "smg": SMG_POLICIES, "vllm-router": VLLM_ROUTER_POLICIES}[args.router]
    if args.policy not in offered:
        parser.error(f"{args.router}'s policies are {', '.join(offered)}")
    threads = args.threads_per_replica or max(1, (os.cpu_count() or 1) // args.replicas)
    block_size = 1 if args.prefix_cache == "radix" else args.block_size
    with tempfile.TemporaryDirectory(prefix="kvcourse-cluster-") as logdir, \
            replicas(args.replicas, replica_args(args), Path(logdir), threads) as children:
        for child in children:
            print(f"{child.name}: {child.url}/v1, KV events on {child.events} (log: {child.log})")
        if args.router != "course":
            front = smg([c.url for c in children], args.policy, Path(logdir), args.port) if args.router == "smg" \
                else vllm_router(children, args.policy, Path(logdir), args.served_model_name, block_size, args.port)
            with front as router:
                print(f"{args.router} ({args.policy}) on {router.url}/v1 (log: {router.log})", flush=True)
                signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwind: the replicas are stopped
                try:
                    return router.process.wait()
                except KeyboardInterrupt:
                    return 0
        router = Router([c.url for c in children], [c.events for c in children], POLICIES[args.policy](),
                        load_tokenizer(args.model), block_size)
        print(f"the course router ({args.policy}) on http://{HOST}:{args.port}/v1", flush=True)
        uvicorn.run(make_router(router), host=HOST, port=args.port, log_level="warning")
    return 0


def demo(argv: list[str]) -> int:
    args = engine_options(demo_parser(__doc__)).parse_args(argv)
    import openai

    model, tok, load_s = timed_load(args.model)
    log, view, batches = EventLog(), CacheView(), []
    try:
        engine = make_engine(model, args, log)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    def keep_events(finished) -> None:  # what a publisher would send, kept here to show it
        if events := log.take():
            batches.append(events)

    with running(make_app(engine, tok, DEFAULT_MODEL, keep_events)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        ask = dict(model=DEFAULT_MODEL, messages=chat(args.prompt, args.system), max_tokens=args.max_new_tokens,
                   temperature=0)
        try:
            answers = [client.chat.completions.create(**ask) for _ in range(1 if args.answer_only else 2)]
        except openai.BadRequestError as e:
            print(f"error: {e.body['message'] if isinstance(e.body, dict) else e}", file=sys.stderr)
            return 2
        if not args.answer_only:
            print(f"model loaded in {load_s:.1f} s; served at {url}/v1 with the {args.prefix_cache} cache\n")
            print("streamed: ", end="", flush=True)
            for chunk in client.chat.completions.create(**ask, stream=True):
                print(chunk.choices[0].delta.content or "", end="", flush=True)
            print("\n")
    if args.answer_only:
        print(answers[0].choices[0].message.content)
        return 0
    for name, answer in zip(("first ask ", "second ask"), answers):
        use = answer.usage
        print(f"{name}: {use.prompt_tokens_details.cached_tokens:4d}/{use.prompt_tokens} prompt tokens from the "
              f"cache, {use.completion_tokens} generated ({answer.choices[0].finish_reason})")
    same = "identical" if answers[1].choices[0].message.content == answers[0].choices[0].message.content \
        else "DIFFERENT (a bug!)"
    print(f"second answer: {same}")
    engine.check_invariants()
    for events in batches:
        for event in events:
            view.apply(event)
    print(f"\nKV events the cache published, in vLLM's format ({len(batches)} batches, one per step that changed the "
          f"cache):\n{events_text(batches, tok.decode)}")
    same = "equal" if view.blocks == cached_blocks(engine.cache_manager) else "DIFFERENT (a bug!)"
    print(f"the {len(view.blocks)} blocks rebuilt from the events alone and the cache's own: {same}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"serve": serve, "cluster": cluster}
    return commands[argv[0]](argv[1:]) if argv[:1] and argv[0] in commands else demo(argv)


if __name__ == "__main__":
    sys.exit(main())
