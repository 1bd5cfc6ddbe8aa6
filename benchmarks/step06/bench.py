"""`python -m course bench step06 --workload fp8`: chapter 6's one CPU bench, the FP8 KV cache's accuracy on the real
model (benchmarks/step06/fp8_accuracy.py). The kernels and the engine are measured on a GPU by `benchmarks.step06`."""
from __future__ import annotations

import argparse

from benchmarks.runner import register


@register("step06")
def bench_step06(args: argparse.Namespace) -> dict:
    from .fp8_accuracy import bench
    return bench(args)
