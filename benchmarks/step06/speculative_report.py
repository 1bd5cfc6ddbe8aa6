"""What a verify step costs on the GPU, from results/h200_speculative.json (`python -m
benchmarks.step06.speculative`): the ratio of a forward of 1 + k tokens per sequence to a decode step, graph
replayed. report.py puts it under the FP8 cache's tables; nothing here measures."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.reporting import met, table

from .common import RESULTS
from .speculative import goals

SHAPES = {"smollm2_135m": "SmolLM2-135M (9/3 x 64)", "llama_3_2_1b": "Llama-3.2-1B (32/8 x 64)"}
COMMAND = "python -m benchmarks.step06.speculative --out step06_triton/results/h200_speculative.json"


def load(path: Path = RESULTS / "h200_speculative.json") -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def tables(res: dict | None) -> str:
    lines = ["#### A verify step (speculative decoding)", ""]
    if res is None:
        return "\n".join(lines + [f"No measurement committed yet: `{COMMAND}` on a GPU writes it.", ""])
    m = res["machine"]
    lines += [f"Measured on {m['gpu']} ({m['sms']} SMs), torch {m['torch']}, Triton {m['triton']}, by "
              + ", then ".join(f"`{c}`" for c in res["commands"]) + ". Chapter 2's `verify_step_cost` on the "
              "Triton attention, random weights, bf16: one forward of 1 + k tokens per sequence over the given "
              "context, as a multiple of a decode step (1 token per sequence) over the same context; replayed from "
              "a CUDA graph (the GPU's time), median of replays with the L2 cache flushed. The forward is chapter 2's "
              "runner's, unfused (chapter 6's fused decode graph is not used for either step).", ""]
    rows, ks = [], None
    for shape, contexts in res.get("verify", {}).items():
        for context, r in contexts.items():
            if "error" in r:
                rows.append([SHAPES.get(shape, shape), context, f"failed: {r['error']}"])
                continue
            for batch, row in r["graph"]["batches"].items():
                ks = ks or sorted(row["ratio"], key=int)
                rows.append([SHAPES.get(shape, shape), f"{int(context):,}", batch, f"{row['decode_ms']:.3f}"]
                            + [f"{row['ratio'][k]:.2f}x" for k in ks])
    if rows:
        lines += table(["model shape", "context", "batch", "decode step (ms)"] + [f"k = {k}" for k in ks or []],
                       rows) + [""]
    targets = [[g["goal"], g["measured"], met(g["met"])] for g in goals(res)]  # judged on the data
    lines += table(["target", "measured", "verdict"], targets) + [""] if targets else []
    return "\n".join(lines)
