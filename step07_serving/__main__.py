"""`python -m step07_serving`: the real model behind the OpenAI-compatible server, asked through the `openai` client:
twice as JSON (the second time the prefix cache serves the prompt), then once more as a stream.
`python -m step07_serving serve --port P` serves it until interrupted."""
from __future__ import annotations

import argparse
import sys

import uvicorn

from course.chat import chat
from step01_kvcache.demo import demo_parser
from step01_kvcache.pretrained import DEFAULT_MODEL, timed_load
from step02_paged import Engine, EngineConfig

from .cache_events import DESIGNS, cached_blocks, with_events
from .kv_events import CacheView, EventLog, ZmqPublisher
from .pictures import events_text
from .server import make_app, running

POOL_TOKENS = 8192  # the pool's size in tokens, as the other chapters' demos size it


def engine_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--prefix-cache", default="bridge", choices=list(DESIGNS),
                        help="the cache manager: none (chapter 2), hash (3), radix (4), bridge (5; the default)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (the radix cache uses 1)")
    parser.add_argument("--max-num-seqs", type=int, default=8, help="requests running at once")
    return parser


def make_engine(model, args: argparse.Namespace, log: EventLog) -> Engine:
    """The engine the options describe, its cache reporting KV events to `log`; the radix cache stores one token per
    slot."""
    block_size = 1 if args.prefix_cache == "radix" else args.block_size
    config = EngineConfig(num_blocks=POOL_TOKENS // max(1, block_size), block_size=block_size,
                          max_num_seqs=args.max_num_seqs)
    return Engine(model, config, with_events(DESIGNS[args.prefix_cache], log))


def serve(argv: list[str]) -> int:
    parser = engine_options(argparse.ArgumentParser(prog="python -m step07_serving serve",
                                                    description="serve the model until interrupted"))
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (default: this machine only)")
    parser.add_argument("--model", default=None, help="a checkpoint folder or .gguf file (default: SmolLM2)")
    parser.add_argument("--served-model-name", default=DEFAULT_MODEL, help="the name clients ask for")
    parser.add_argument("--kv-events-port", type=int, default=None,
                        help="publish KV-cache events in vLLM's format on this ZMQ PUB port (default: none)")
    args = parser.parse_args(argv)
    model, tok, load_s = timed_load(args.model)
    log = EventLog()
    try:
        engine = make_engine(model, args, log)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"model loaded in {load_s:.1f} s; {args.prefix_cache} cache, {engine.config.num_blocks} blocks of "
          f"{engine.config.block_size}; serving {args.served_model_name!r} on http://{args.host}:{args.port}/v1")
    publisher = None
    if args.kv_events_port is not None:
        publisher = ZmqPublisher(f"tcp://{args.host}:{args.kv_events_port}")
        print(f"KV events on {publisher.endpoint}, topic {publisher.topic.decode()!r}")
    after_step = (lambda finished: publisher.publish(log.take())) if publisher else (lambda finished: log.take())
    try:
        uvicorn.run(make_app(engine, tok, args.served_model_name, after_step), host=args.host, port=args.port)
    finally:
        if publisher is not None:
            publisher.close()
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
    return serve(argv[1:]) if argv[:1] == ["serve"] else demo(argv)


if __name__ == "__main__":
    sys.exit(main())
