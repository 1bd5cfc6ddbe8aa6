"""`python -m course bench <chapter> --workload <name> [--json]`: a chapter's engine, cache off and on, in
one process, so the ratios are measured side by side. Each chapter's bench is `benchmarks/stepNN/bench.py`; the
runner they share is benchmarks/runner.py."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch

from benchmarks.runner import BENCHES
from course import results


def benches() -> dict[str, Callable[[argparse.Namespace], dict]]:
    """Every chapter's bench: importing a chapter's bench module registers it."""
    from benchmarks.step01 import bench as _01  # noqa: F401
    from benchmarks.step02 import bench as _02  # noqa: F401
    from benchmarks.step03 import bench as _03  # noqa: F401
    from benchmarks.step04 import bench as _04  # noqa: F401
    from benchmarks.step05 import bench as _05  # noqa: F401
    from benchmarks.step06 import bench as _06  # noqa: F401
    return dict(sorted(BENCHES.items()))


def main(argv: list[str]) -> int:
    every = benches()
    p = argparse.ArgumentParser(prog="python -m course bench", description=__doc__)
    p.add_argument("chapter", help=f"one of {', '.join(every)} (or the package name)")
    p.add_argument("--workload", default=None, help="short | long | shared_prefix | batch (chapter-dependent)")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.add_argument("--model", default=None, help="local checkpoint folder or .gguf (default SmolLM2-135M)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens generated per request (default: the chapter's; TTFT does not depend on it)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds for best-of timings (where used)")
    p.add_argument("--contexts", type=int, nargs="+", default=None, help="step01: context lengths of the sweep")
    p.add_argument("--save", action="store_true",
                   help="also write the run to the chapter's results/WORKLOAD.json (read by `python -m course report`)")
    args = p.parse_args(argv)
    if args.contexts and min(args.contexts) < 1:
        p.error("context lengths must be positive")
    chapter = args.chapter.split("_")[0]
    if chapter not in every:
        print(f"no bench for {args.chapter!r}; choose from {', '.join(every)}", file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    meta = results.started("python -m course bench " + " ".join(argv))
    try:
        result = every[chapter](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.save:
        print(f"wrote {results.save(chapter, result['workload'], result, meta)}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result))
        for k, v in result.items():
            print(f"{k:<{width}}  {v}")
    return 0

