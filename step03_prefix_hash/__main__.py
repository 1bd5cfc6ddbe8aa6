"""`python -m step03_prefix_hash`: requests through the prefix-caching engine on the real model — what each
one found in the cache, who holds the shared blocks, and the tree that the chained block hashes form.

Without --prompt it runs the `short` workload (3 personas x 3 questions, one request at a time); with
--prompt it runs your prompt once cold, then twice more at the same time, both served from the cache.
"""
from __future__ import annotations

import sys

from course.chat import chat_ids, stop_ids
from course.workloads import get_workload
from step01_kvcache.demo import DEFAULT_PROMPT, demo_parser
from step01_kvcache.pretrained import timed_load
from step01_kvcache.request import SamplingParams
from step02_paged import Engine, EngineConfig

from .kv_cache_manager import PrefixCachingKVCacheManager
from .pictures import hash_tree_text

BLOCK_SIZE = 16


def main(argv: list[str] | None = None) -> int:
    parser = demo_parser(__doc__)
    parser.set_defaults(prompt=None)  # no --prompt: the `short` workload (DEFAULT_PROMPT for --answer-only)
    args = parser.parse_args(argv)
    model, tok, load_s = timed_load(args.model)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, stop_token_ids=stop_ids(tok))
    engine = Engine(model, EngineConfig(num_blocks=512, block_size=BLOCK_SIZE), PrefixCachingKVCacheManager)
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)
    answer = lambda out: tok.decode(out.output_ids, skip_special_tokens=True)
    try:
        if args.answer_only:
            ids = chat_ids(tok, args.prompt or DEFAULT_PROMPT, args.system)
            engine.generate([ids], params)
            print(answer(engine.generate([ids], params)[0]))  # the second run, served from the cache
            return 0
        cfg = model.config
        print(f"model: {cfg.num_layers} layers, {cfg.num_kv_heads} KV heads (loaded in {load_s:.1f} s); "
              f"prefix cache of {BLOCK_SIZE}-token blocks, {engine.config.num_blocks} blocks in the pool\n")
        if args.prompt is None:
            run_workload(engine, tok, params, answer)
        else:
            run_prompt_three_times(engine, chat_ids(tok, args.prompt, args.system), params, answer)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    bm = engine.cache_manager.block_manager
    held = sum(1 for c in bm.ref_count if c)
    print(f"\nref counts now: {'all 0' if not held else f'{held} blocks still held'} — {bm.num_cached} blocks "
          f"cached, {len(bm.free_blocks)} of {bm.num_blocks} in the LRU free queue (cached ones evicted oldest first)")
    engine.check_invariants()
    print("\nthe tree the chained hashes form (one line per run of single-child blocks):")
    print(hash_tree_text(engine.cache_manager, decode=decode))
    return 0


def run_workload(engine: Engine, tok, params: SamplingParams, answer) -> None:
    workload = get_workload("short")
    print(f"workload `short`: {workload.description}\n")
    outs = []
    for i, (chat, ids) in enumerate(zip(workload.messages, workload.prompts(tok))):
        [out] = engine.generate([ids], params)
        outs.append(out)
        question = chat[-1]["content"]
        print(f"[{i + 1}] {_hit(out)}  TTFT {out.ttft_s:5.2f} s  Q: {_clip(question, 44)}")
        print(f"    A: {_clip(answer(out), 90)}")
    cached, total = sum(o.num_cached_tokens for o in outs), sum(len(o.prompt_ids) for o in outs)
    print(f"\ntokens served from the cache: {cached}/{total} ({cached / total:.1%}); "
          f"requests that hit: {sum(o.num_cached_tokens > 0 for o in outs)}/{len(outs)}")


def run_prompt_three_times(engine: Engine, ids: list[int], params: SamplingParams, answer) -> None:
    print(f"prompt: {len(ids)} tokens = {len(ids) // BLOCK_SIZE} full blocks + {len(ids) % BLOCK_SIZE} tokens\n")
    [cold] = engine.generate([ids], params)
    print(f"run 1 (cold):  {_hit(cold)}  TTFT {cold.ttft_s:.2f} s\n  answer: {answer(cold)}\n")
    sids = [engine.add_request(ids, params) for _ in range(2)]
    engine.step()  # both admitted: each holds the cached blocks
    refs = [engine.cache_manager.block_manager.ref_count[b] for b in engine.seqs[sids[0]].block_table]
    print(f"run 2 (two copies at once): ref counts of the first copy's blocks after admission: {refs}")
    done = {}
    while engine.has_unfinished():
        done.update((o.seq_id, o) for o in engine.step())
    for sid in sids:
        print(f"  copy {sid}: {_hit(done[sid])}  TTFT {done[sid].ttft_s:.2f} s")
    same = all(done[s].output_ids == cold.output_ids for s in sids)
    print(f"  answers identical to run 1: {'yes' if same else 'NO'}")


def _hit(out) -> str:
    n = len(out.prompt_ids)
    return f"cached {out.num_cached_tokens:4d}/{n} tokens ({out.num_cached_tokens / n:4.0%})"


def _clip(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


if __name__ == "__main__":
    sys.exit(main())
