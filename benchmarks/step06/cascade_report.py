"""Cascade attention's measured results, from results/h200_cascade.json (`python -m benchmarks.step06.cascade`):
one layer's decode attention with and without cascade, the engine end to end, and the targets met or missed.
report.py puts it under the engine's tables; nothing here measures."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.reporting import met, table

from .cascade import goals
from .common import RESULTS

SHAPES = {"llama_3_2_1b": "a Llama-3.2-1B layer (32/8 x 64)", "smollm2_135m": "SmolLM2-135M (9/3 x 64)",
          "smollm2_135m_two_prompts": "SmolLM2-135M, two prompts of 4,096"}


def load(path: Path = RESULTS / "h200_cascade.json") -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def layer_table(res: dict) -> list[str]:
    """One layer's decode attention with and without cascade, per head shape (the cascade unit's one table)."""
    rows = []
    for name, r in res.get("attention", {}).items():
        if "error" in r:
            rows.append([SHAPES.get(name, name), f"failed: {r['error']}"] + [""] * 7)
            continue
        rows.append([SHAPES.get(name, name), r["plain_us"], r.get("plain_distinct_us", "-"), r["cascade_us"],
                     f"{r['cascade_graph_grid_us']} ({r['graph_suffix_splits']})", r["cascade_one_axis_us"],
                     f"**{r['speedup']}x**", r.get("bound_us", "-"),
                     f"{r['plain_bytes'] / 2**20:,.0f} / {r['cascade_bytes'] / 2**20:,.1f}"])
    if not rows:
        return []
    return table(["heads", "plain paged decode", "plain, prefix in distinct blocks", "cascade",
                  "cascade, as a captured step replays it (suffix splits)", "cascade, one suffix axis for "
                  "the longest context the graphs serve", "plain / cascade", "suffix decode + one SDPA (bound)",
                  "MiB read, plain / cascade"], rows)


def unit(res: dict | None) -> str:
    """The cascade unit's *Measured here*: one layer's table, with the machine it ran on."""
    if res is None or not layer_table(res):
        return "No measurement committed yet: `python -m benchmarks.step06.cascade` on a GPU writes it.\n"
    m = res["machine"]
    caption = (f"One layer's decode attention on the {m['gpu']}, 256 sequences behind a 4,096-token prefix with "
               "16-128 tokens of their own, block 16, bf16, median of CUDA-graph replays (µs):")
    return "\n".join([caption, ""] + layer_table(res) + [""])


def tables(res: dict | None) -> str:
    lines = ["#### Cascade attention", ""]
    if res is None:
        return "\n".join(lines + ["No measurement committed yet: `python -m benchmarks.step06.cascade --out "
                                  "step06_triton/results/h200_cascade.json` on a GPU writes it.", ""])
    m = res["machine"]
    lines += [f"Measured on {m['gpu']} ({m['sms']} SMs), torch {m['torch']}, Triton {m['triton']}, by "
              + ", then ".join(f"`{c}`" for c in res["commands"]) + f"; device copy {res['copy_tb_s']} TB/s.", ""]
    layer = layer_table(res)
    if layer:
        lines += ["One layer's decode attention, 256 sequences behind the prefix, 16-128 tokens of their own, "
                  "block 16, bf16, each contender checked against fp32 first, median of CUDA-graph replays (µs):", ""]
        lines += layer + [""]
    engine_rows = []
    for part, label in (("engine_1b", "Llama-3.2-1B shape"), ("engine_smollm2", "SmolLM2-135M shape")):
        for workload, r in res.get(part, {}).items():
            if not isinstance(r, dict) or "error" in r:
                continue
            base = r.get("no_cascade", {}).get("decode_tokens_per_s")
            for name in ("no_cascade", "cascade", "hash_common_prefix", "bridge_groups"):
                if name in r:
                    x = r[name]
                    engine_rows.append([label, workload.replace("_", " "), name.replace("_", " "),
                                        x["decode_tokens_per_s"], f"{x['decode_tokens_per_s'] / base:.2f}x",
                                        x["decode_ms_per_step"], x["tokens_per_s"]])
            if "hf_static" in r:
                hf = r["hf_static"]
                batches = f" (batches of {hf['batch']})" if "batch" in hf else ""
                engine_rows.append([label, workload.replace("_", " "), f"HF static `generate`{batches}", "-", "-", "-",
                                    hf.get("tokens_per_s", f"failed: {hf.get('error')}")])
    if engine_rows:
        lines += ["The engine end to end (chapter 5's cache on the Triton kernels, fused CUDA graphs, overlapped; the "
                  "system prompts cached before the requests arrive, as a server's would be): decode tokens/s over "
                  "the decode phase, and tokens/s over the whole run, prefill included:", ""]
        lines += table(["model", "workload", "engine", "decode tokens/s", "vs no cascade", "ms per decode step",
                        "tokens/s, whole run"], engine_rows) + [""]
    rows = goals(res)
    if rows:
        lines += table(["target", "measured", "verdict"], [[g["goal"], g["measured"], met(g["met"])] for g in rows])
        lines += [""]
    return "\n".join(lines)
