"""`python -m step05_bridge`: ask the real model twice through the bridge (the second time every full block of
the prompt comes from the tree), then run a shared workload in small batches and print both levels of
reference counts: lock_ref on the tree's nodes, ref_count on the blocks."""
from __future__ import annotations

import sys

from course.demo import demo_parser, stop_ids
from course.pretrained import timed_load
from course.workloads import WORKLOADS
from step01_kvcache.generate import SamplingParams
from step04_radix.__main__ import ask_twice, report_asks, run_workload

from .engine import BridgeEngine, BridgeEngineConfig


def main(argv: list[str] | None = None) -> int:
    parser = demo_parser(__doc__)
    parser.add_argument("--workload", default="short", choices=[*WORKLOADS, "none"],
                        help="shared workload to run after the prompt (default: short)")
    parser.add_argument("--workload-new-tokens", type=int, default=12, help="tokens generated per workload request")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16, as vLLM)")
    args = parser.parse_args(argv)
    try:
        config = BridgeEngineConfig(num_blocks=8192 // max(1, args.block_size), block_size=args.block_size)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model, tok, load_s = timed_load(args.model)
    stops = stop_ids(tok)
    engine = BridgeEngine(model, config)
    asked = ask_twice(engine, tok, args)
    if not isinstance(asked, tuple):
        return asked
    ids, first, second = asked
    bs = config.block_size
    print(f"model loaded in {load_s:.1f} s; pool of {config.num_blocks} blocks of {bs} tokens\n")
    print(f"answer: {tok.decode(first.output_ids, skip_special_tokens=True)}\n")
    report_asks(ids, first, second)
    print(f"the tree routed all {len(ids)} tokens, but only full blocks are shared, and the last prompt token "
          f"is always recomputed: ({len(ids)} - 1) // {bs} * {bs} = {(len(ids) - 1) // bs * bs}\n")

    def decode(token_ids: list[int]) -> str:
        return tok.decode(token_ids)

    if args.workload != "none":
        run_workload(engine, args.workload, SamplingParams(max_new_tokens=args.workload_new_tokens,
                                                           stop_token_ids=stops), decode)
    engine.check_invariants()
    kv = engine.kv
    print(f"\nafter everything: every lock released; {kv.num_cached_blocks} blocks held by the tree alone "
          f"(ref_count 1), {kv.block_manager.num_free} free, {kv.num_cached_blocks + kv.block_manager.num_free} "
          f"= the pool:")
    print(kv.to_text(decode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
