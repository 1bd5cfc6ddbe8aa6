"""`python -m step05_bridge`: ask the real model twice through the bridge (the second time every full block of
the prompt comes from the tree), then run a shared workload in small batches and print both levels of
reference counts: lock_ref on the tree's nodes, ref_count on the blocks."""
from __future__ import annotations

import sys

from step01_kvcache.demo import ask_twice, report_asks, run_demo_workload, workload_parser
from step01_kvcache.pretrained import timed_load
from step02_paged import Engine, EngineConfig

from .bridge_cache import BridgeKVCacheManager
from .pictures import bridge_text


def main(argv: list[str] | None = None) -> int:
    parser = workload_parser(__doc__)
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16, as vLLM)")
    args = parser.parse_args(argv)
    try:
        config = EngineConfig(num_blocks=8192 // max(1, args.block_size), block_size=args.block_size)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model, tok, load_s = timed_load(args.model)
    engine = Engine(model, config, BridgeKVCacheManager)
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
    run_demo_workload(engine, args, tok, bridge_text)
    kv = engine.cache_manager
    print(f"\nafter everything: every lock released; {kv.num_cached_blocks} blocks held by the tree alone "
          f"(ref_count 1), {kv.block_manager.num_free} free, {kv.num_cached_blocks + kv.block_manager.num_free} "
          f"= the pool:")
    print(bridge_text(kv, tok.decode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
