"""`python -m step06_triton`: the real model answers through chapter 5's engine twice — attention on chapter 2's
torch path, then on this chapter's Triton kernels — and the two answers must be the same tokens. On a CPU
the kernels run through Triton's interpreter (exact, slow: keep answers short); on a GPU they compile."""
from __future__ import annotations

import sys
import time

from course.chat import chat_ids, stop_ids
from step01_kvcache.demo import demo_parser
from step01_kvcache.pretrained import timed_load
from step01_kvcache.request import SamplingParams

from .interpreter import use_interpreter_without_gpu


def main(argv: list[str] | None = None) -> int:
    interpreted = use_interpreter_without_gpu()  # first: Triton reads the switch when it is imported
    from .engine import make_engine  # the kernels, and triton with them

    parser = demo_parser(__doc__)
    parser.set_defaults(max_new_tokens=16 if interpreted else 64)
    parser.add_argument("--prefix-cache", default="bridge", choices=["none", "hash", "radix", "bridge", "offset"],
                        help="which chapter's engine runs on the kernels (default: chapter 5's bridge)")
    args = parser.parse_args(argv)
    model, tok, load_s = timed_load(args.model)
    try:
        ids = chat_ids(tok, args.prompt, args.system)
        params = SamplingParams(max_new_tokens=args.max_new_tokens, stop_token_ids=stop_ids(tok))
        block_size = 1 if args.prefix_cache == "radix" else 16
        answers, seconds = {}, {}
        for backend in ("triton", "torch") if not args.answer_only else ("triton",):
            engine = make_engine(model, args.prefix_cache, backend, num_blocks=4096 // block_size,
                                 block_size=block_size)
            t0 = time.perf_counter()
            answers[backend] = engine.generate([ids], params)[0].output_ids
            seconds[backend] = time.perf_counter() - t0
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = tok.decode(answers["triton"], skip_special_tokens=True)
    if args.answer_only:
        print(text)
        return 0
    where = ("on the CPU through Triton's interpreter (TRITON_INTERPRET=1): every kernel program runs as numpy "
             "code, exact but slow" if interpreted else f"compiled for {model.device}")
    print(f"model loaded in {load_s:.1f} s; the kernels run {where}\n")
    print(f"answer: {text}\n")
    print(f"{len(ids)} prompt tokens, {len(answers['triton'])} new tokens, prefix cache '{args.prefix_cache}':")
    for backend in ("torch", "triton"):
        print(f"  attention_backend={backend!r:9} {seconds[backend]:7.2f} s")
    same = answers["triton"] == answers["torch"]
    print(f"Triton tokens == chapter 5's torch path: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
