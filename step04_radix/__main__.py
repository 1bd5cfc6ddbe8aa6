"""`python -m step04_radix`: ask the real model twice (the second time the radix tree serves all but the last
prompt token), then run a shared workload in small batches and show hit rates, lock refs and the tree."""
from __future__ import annotations

import sys

from course.demo import chat_ids, demo_parser, stop_ids
from course.pretrained import timed_load
from course.workloads import WORKLOADS, get_workload
from step01_kvcache.request import SamplingParams
from step02_paged import Engine, EngineConfig

from .pictures import cache_text, tree_text
from .radix_cache import RadixKVCacheManager

BATCH = 3  # requests submitted together: while they run, their prefixes are locked


def workload_parser(doc: str):
    """The demo's arguments plus the shared workload to run after the user's prompt."""
    parser = demo_parser(doc)
    parser.add_argument("--workload", default="short", choices=[*WORKLOADS, "none"],
                        help="shared workload to run after the prompt (default: short)")
    parser.add_argument("--workload-new-tokens", type=int, default=12, help="tokens generated per workload request")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = workload_parser(__doc__).parse_args(argv)
    model, tok, load_s = timed_load(args.model)
    engine = Engine(model, EngineConfig(num_blocks=8192, block_size=1), RadixKVCacheManager)
    asked = ask_twice(engine, tok, args)
    if not isinstance(asked, tuple):
        return asked
    ids, first, second = asked
    print(f"model loaded in {load_s:.1f} s; pool of {engine.config.num_blocks} slots, one token each\n")
    print(f"answer: {tok.decode(first.output_ids, skip_special_tokens=True)}\n")
    report_asks(ids, first, second)
    print("the last prompt token is always recomputed to get its logits\n")
    decode = run_demo_workload(engine, args, tok, cache_text)
    print("\nthe tree after everything (every lock released; yellow in the notebook = evictable leaves):")
    print(tree_text(engine.cache_manager.tree, decode))
    return 0


def ask_twice(engine, tok, args) -> int | tuple:
    """The user's prompt through `engine` twice (the second time the cache serves it): (ids, first, second).
    With --answer-only, prints the first answer and returns 0; on bad input prints the error and returns 2."""
    try:
        ids = chat_ids(tok, args.prompt, args.system)
        params = SamplingParams(max_new_tokens=args.max_new_tokens, stop_token_ids=stop_ids(tok))
        first = engine.generate([ids], params)[0]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.answer_only:
        print(tok.decode(first.output_ids, skip_special_tokens=True))
        return 0
    return ids, first, engine.generate([ids], params)[0]


def report_asks(ids: list[int], first, second) -> None:
    for name, out in (("first ask ", first), ("second ask", second)):
        print(f"{name}: {out.num_cached_tokens:4d}/{len(ids)} prompt tokens from the tree "
              f"({out.num_cached_tokens / len(ids):.1%}), TTFT {out.ttft_s * 1e3:.0f} ms")
    same = "identical" if second.output_ids == first.output_ids else "DIFFERENT (a bug!)"
    print(f"second answer: {same}")


def run_demo_workload(engine: Engine, args, tok, describe):
    """Run `--workload` (unless 'none') after the asks, check every invariant; returns the token decoder.
    `describe(kv, decode)` renders the cache while a batch holds its locks."""
    def decode(ids: list[int]) -> str:
        return tok.decode(ids)

    if args.workload != "none":
        params = SamplingParams(max_new_tokens=args.workload_new_tokens, stop_token_ids=stop_ids(tok))
        run_workload(engine, args.workload, params, decode, describe)
    engine.check_invariants()
    return decode


def run_workload(engine: Engine, name: str, params: SamplingParams, decode, describe) -> None:
    workload = get_workload(name)
    from course.pretrained import load_tokenizer

    prompts = workload.prompts(load_tokenizer()) * workload.rounds
    print(f"workload {name!r}: {len(prompts)} requests, {BATCH} at a time, {params.max_new_tokens} new tokens each")
    total = cached = 0
    for start in range(0, len(prompts), BATCH):
        batch = prompts[start: start + BATCH]
        ids = [engine.add_request(p, params) for p in batch]
        done = {o.seq_id: o for o in engine.step()}  # one step: every request admitted, its prefix locked
        if start == BATCH:
            print(f"\nwhile requests {start}-{start + len(batch) - 1} run, their prefixes are locked "
                  f"(lock_ref = how many of them use a node):")
            print(describe(engine.cache_manager, decode))
            print()
        while engine.has_unfinished():
            done.update((o.seq_id, o) for o in engine.step())
            engine.check_invariants()
        for i, sid in enumerate(ids):
            out = done[sid]
            total, cached = total + len(out.prompt_ids), cached + out.num_cached_tokens
            text = decode(out.output_ids).replace("\n", " ")
            print(f"  request {start + i}: {out.num_cached_tokens:4d}/{len(out.prompt_ids)} cached "
                  f"({out.num_cached_tokens / len(out.prompt_ids):5.1%})  {text[:60]!r}")
    tree = engine.cache_manager.tree
    print(f"hit rate {cached}/{total} = {cached / total:.1%}; tree: {tree.num_nodes} nodes, {tree.total_size} tokens, "
          f"{tree.protected_size} locked, {engine.cache_manager.num_evicted} evicted")


if __name__ == "__main__":
    sys.exit(main())
