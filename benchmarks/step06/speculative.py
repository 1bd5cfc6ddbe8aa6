"""`python -m benchmarks.step06.speculative [--out FILE]`: what a verify step costs on a GPU.

Speculative decoding (chapter 2) pays one forward of 1 + k tokens per sequence for up to 1 + k tokens. On a CPU the
forward's time grows with its tokens; on a GPU a decode step reads every weight once whatever its few rows, so a
verify step should cost about a decode step until its rows fill the matrix units. This part measures it with
chapter 2's `verify_step_cost` on the course's Triton attention: SmolLM2's shape and a Llama-3.2-1B's, random weights
(a forward's time does not depend on them; acceptance does, and chapter 2 measures it on the real model on a CPU),
bf16, contexts of 512 and 4,096 tokens, batches of 1, 8 and 64, k = 1..8. Each forward is timed twice: replayed from
a CUDA graph (the GPU's time, as the engine's graphs replay a decode step) and launched eagerly (with the host's
launches, as an eager engine pays them).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from benchmarks.step05.speculative import verify_step_cost
from step06_triton.triton_attention import TritonPagedAttention

from .common import MODELS, Parts, median_ms, needs_gpu, random_model

KS = range(1, 9)
BATCHES = (1, 8, 64)
CONTEXTS = (512, 4096)


def graph_ms(engine, batch) -> float:
    return median_ms(lambda: engine.runner.forward(batch))


def verify_cost(shape: str, context: int) -> dict:
    """The verify step's cost, replayed from a CUDA graph (the GPU's time: launched eagerly, a step of this small
    model is the host's, and the ratio says nothing about the GPU)."""
    model = random_model(MODELS[shape], torch.bfloat16)
    return dict(graph=verify_step_cost(model, ks=KS, batch_sizes=BATCHES, context=context,
                                       attention=TritonPagedAttention, timer=graph_ms))


def goals(res: dict) -> list[dict]:
    """The verify step's target, met or missed: a step of 1 + 4 tokens per sequence at batch 8 costs less than two
    decode steps (graph replay)."""
    rows = []
    for shape, contexts in res.get("verify", {}).items():
        for context, r in contexts.items():
            batches = {int(b): row for b, row in r.get("graph", {}).get("batches", {}).items()}  # str in the JSON
            ratio = {int(k): x for k, x in batches.get(8, {}).get("ratio", {}).items()}.get(4)
            if ratio is not None:
                rows.append(dict(goal=f"{shape}, context {context}, batch 8: a verify step of 1 + 4 tokens costs "
                                      "less than 2 decode steps (graph replay)", measured=ratio, met=ratio < 2))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the JSON here (step06_triton/results/h200_speculative.json)")
    ap.add_argument("--shapes", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = ap.parse_args(argv)
    if not needs_gpu("benchmarks.step06.speculative"):
        return 2
    parts = Parts(args.out, "python -m benchmarks.step06.speculative " + " ".join(argv or sys.argv[1:]))
    for shape in args.shapes:
        for context in CONTEXTS:
            parts.run(("verify", shape, str(context)), lambda s=shape, c=context: verify_cost(s, c))
    parts.finish(goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
