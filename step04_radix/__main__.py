"""`python -m step04_radix`: ask the real model twice (the second time the radix tree serves all but the last
prompt token), then run a shared workload in small batches and show hit rates, lock refs and the tree."""
from __future__ import annotations

import sys

from course.demo import ask_twice, report_asks, run_demo_workload, workload_parser
from course.pretrained import timed_load
from step02_paged import Engine, EngineConfig

from .pictures import cache_text, tree_text
from .radix_cache import RadixKVCacheManager


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
    run_demo_workload(engine, args, tok, cache_text)
    tree = engine.cache_manager.tree
    print(f"tree: {tree.num_nodes} nodes, {tree.total_size} tokens, {tree.protected_size} locked, "
          f"{engine.cache_manager.num_evicted} evicted")
    print("\nthe tree after everything (every lock released; yellow in the notebook = evictable leaves):")
    print(tree_text(tree, tok.decode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
