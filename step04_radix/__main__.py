"""`python -m step04_radix`: ask the real model twice (the second time the radix tree serves all but the last
prompt token), then run a shared workload in small batches and show hit rates, lock refs and the tree; last, the
waiting queue before and after a cache-aware policy orders it."""
from __future__ import annotations

import sys

from course.workloads import get_workload
from step01_kvcache.demo import ask_twice, report_asks, run_demo_workload, workload_parser
from step01_kvcache.pretrained import timed_load
from step01_kvcache.request import SamplingParams
from step02_paged import Engine, EngineConfig

from .pictures import cache_text, queue_text, tree_text
from .policy import LongestPrefixMatch
from .radix_cache import RadixKVCacheManager


def show_lpm_order(engine: Engine, tok) -> None:
    """Queue requests that find more or less of their prompt in the tree (questions about documents never seen,
    interleaved with the `short` workload's), print the queue before and after `lpm` orders it, then take them
    back: nothing runs."""
    docs, short = get_workload("multi_doc").prompts(tok), get_workload("short").prompts(tok)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=1)) for pair in zip(docs[:3], short[3:6]) for p in pair]
    waiting, kv = engine.scheduler.waiting, engine.cache_manager

    def text(ids: list[int]) -> str:  # the prompt without the template's markers and the assistant's cue
        return tok.decode(ids, skip_special_tokens=True).strip().removesuffix("assistant").strip()

    print(f"\n{len(ids)} requests wait, in arrival order:\n{queue_text(kv, waiting, text)}")
    LongestPrefixMatch().order(waiting, kv, engine.config.max_num_seqs)
    print(f"after `lpm` (the longest cached prefix first; see policy.py):\n{queue_text(kv, waiting, text)}")
    for seq_id in ids:
        engine.abort(seq_id)


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
    show_lpm_order(engine, tok)
    engine.check_invariants()
    return 0


if __name__ == "__main__":
    sys.exit(main())
