"""`python -m step01_kvcache`: ask the real model a question, then show what the cache saves per token."""
from __future__ import annotations

import sys
import time

from course.chat import chat_ids, stop_ids
from step01_kvcache.demo import demo_parser
from step01_kvcache.pretrained import timed_load

from .cost import format_costs, step_costs
from .generate import SamplingParams, generate


def main(argv: list[str] | None = None) -> int:
    args = demo_parser(__doc__).parse_args(argv)
    model, tok, load_s = timed_load(args.model)
    try:
        ids = chat_ids(tok, args.prompt, args.system)
        params = SamplingParams(max_new_tokens=args.max_new_tokens, stop_token_ids=stop_ids(tok))
        t0 = time.perf_counter()
        out = generate(model, ids, params, use_cache=True)
        elapsed = time.perf_counter() - t0
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    answer = tok.decode(out, skip_special_tokens=True)
    if args.answer_only:
        print(answer)
        return 0
    cfg = model.config
    print(f"model: {cfg.num_layers} layers, {cfg.num_heads} query heads / {cfg.num_kv_heads} KV heads, "
          f"head_dim {cfg.head_dim} (loaded in {load_s:.1f} s)")
    print(f"prompt: {len(ids)} tokens through the chat template\n")
    print(f"answer: {answer}\n")
    print(f"{len(out)} tokens in {elapsed:.2f} s with the KV cache ({len(out) / elapsed:.1f} tokens/s)")
    print(f"KV cache: {cfg.kv_bytes_per_token()} bytes per token (fp32), "
          f"{(len(ids) + len(out)) * cfg.kv_bytes_per_token() / 2**20:.1f} MiB for this request\n")
    print("one decode step as the sequence grows (best of 3):")
    print(format_costs(step_costs(model, [16, 64, 256, 512])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
