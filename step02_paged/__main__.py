"""`python -m step02_paged`: your prompt in a ragged batch on the real model, with block tables and the pool."""
from __future__ import annotations

import sys

from course.chat import chat_ids, stop_ids
from course.workloads import get_workload
from step01_kvcache.demo import demo_parser
from step01_kvcache.pretrained import timed_load
from step01_kvcache.request import SamplingParams

from .config import EngineConfig
from .engine import Engine
from .pictures import occupancy_map


def main(argv: list[str] | None = None) -> int:
    parser = demo_parser(__doc__)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=64)
    args = parser.parse_args(argv)
    model, tok, load_s = timed_load(args.model)
    try:
        engine = Engine(model, EngineConfig(num_blocks=args.num_blocks, block_size=args.block_size,
                                            max_num_batched_tokens=128))
        params = SamplingParams(max_new_tokens=args.max_new_tokens, stop_token_ids=stop_ids(tok))
        mine = engine.add_request(chat_ids(tok, args.prompt, args.system), params)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    others = get_workload("batch").prompts(tok)[:3] if not args.answer_only else []
    for p in others:
        engine.add_request(p, SamplingParams(max_new_tokens=24, stop_token_ids=stop_ids(tok)))
    if not args.answer_only:
        print(f"model loaded in {load_s:.1f} s; pool: {args.num_blocks} blocks x {args.block_size} tokens "
              f"({engine.kv_bytes_per_block / 2**20:.2f} MiB per block, {str(model.dtype).removeprefix('torch.')})")
        print("requests: " + ", ".join(f"seq {s.seq_id}: {s.num_prompt_tokens} prompt tokens"
                                       for s in engine.scheduler.waiting) + "\n")
        print("step  scheduled (seq:tokens)             pool (digit = holding seq, . = free)")
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            done[out.seq_id] = out
        if not args.answer_only and (engine.stats.steps <= 6 or engine.stats.steps % 8 == 0):
            sched = " ".join(f"{i}:{n}" for i, n in engine.last_scheduled) or "-"
            print(f"{engine.stats.steps:>4}  {sched:<34} {occupancy_map(engine.cache_manager)}")
        if not args.answer_only and engine.stats.steps == 3:
            print("      block tables: " + "; ".join(f"seq {s.seq_id} -> {s.block_table}"
                                                    for s in engine.scheduler.running))
    answer = tok.decode(done[mine].output_ids, skip_special_tokens=True)
    if args.answer_only:
        print(answer)
        return 0
    print(f"\nanswer to seq {mine}: {answer}\n")
    s = engine.stats
    print(f"{s.steps} steps, peak {s.peak_blocks} of {args.num_blocks} blocks, "
          f"waste (allocated but unfilled slots) {s.waste_fraction:.1%}; free blocks after drain: "
          f"{engine.cache_manager.block_manager.num_free}/{args.num_blocks}")
    for i, out in sorted(done.items()):
        print(f"  seq {i}: {len(out.prompt_ids)} prompt + {len(out.output_ids)} new tokens, "
              f"TTFT {out.ttft_s * 1e3:.0f} ms, preempted {out.num_preemptions}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
