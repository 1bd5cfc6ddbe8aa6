"""The FP8 KV cache's numbers, from results/fp8.json (the real model's accuracy, on a CPU: `python -m course bench
step06 --workload fp8 --save`) and results/h200_fp8.json (the kernels and the capacity, on a GPU: `python -m
benchmarks.step06.fp8 --out step06_triton/results/h200_fp8.json`). `section` is the lesson's trade-off table
(the `fp8` markers of the results page), `tables` its GPU part; report.py registers both.
Nothing here measures."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.reporting import fmt, met, provenance, table
from course import results
from step02_paged.geometry import cdiv

from .common import RESULTS
from .fp8_accuracy import first_divergence
from .kernels import PREFILL_SHAPE

GPU_COMMAND = "python -m benchmarks.step06.fp8 --out step06_triton/results/h200_fp8.json"
IDENTITY_ENGINES = ["triton", "triton_graphs_fused_overlap", "triton_graphs_fused_cascade"]  # measure/fp8.py's runs
DECODE_HEADS, DECODE_TARGET = "32/8x128", 1.8  # the ragged decode's target: context tokens/s over the bf16 pool's
CPU_COMMAND = "python -m course bench step06 --workload fp8 --save"
POOLS = {  # the accuracy JSON's variant -> (scales, the capacity table's pool)
    "fp8, per token and head (dynamic)": ("per token and head, computed as stored", "fp8, scales per token and head"),
    "fp8, per layer (calibrated)": ("per layer (vLLM's k_scale / v_scale), calibrated", "fp8, static scales"),
    "fp8, per layer and head (calibrated)": ("per layer and head, calibrated", "fp8, static scales"),
    "fp8, per layer, 1.0 (uncalibrated)": ("per layer, 1.0 (no calibration)", "fp8, static scales"),
}
KEPT = next(iter(POOLS))
REQUESTS_OF = {"smollm2_135m": (2048, 1), "llama_3_8b": (8192, 100)}  # capacity rows: (tokens a request, GiB)


def load_accuracy() -> dict | None:
    return results.load("step06", "fp8")


def load_gpu(path: Path = RESULTS / "h200_fp8.json") -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def load_ablation(path: Path = RESULTS / "h200_fp8_ablation.json") -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def best(rows: dict, pool: str, key: str) -> float:
    """The best figure of a pool over the tiles a variant ran."""
    return max(r[key] for name, r in rows.items() if name.split()[0] == pool)


def ablation(ab: dict) -> list[str]:
    """measure/fp8_ablation.py's table: each variant's best tile against the bf16 pool, decode and prefill."""
    ref = ab["variants"]["kernel"]
    heads = list(ref["decode"])
    rows = []
    for variant, v in ab["variants"].items():
        if "error" in v:
            rows.append([f"`{variant}`", f"failed: {v['error'][-200:]}"] + [""] * len(heads))
            continue
        cells = []
        for h in heads:
            tok = best(v["decode"][h], "fp8_token", "context_tokens_per_s")
            cells.append(f"{tok:,} ({tok / ref['decode'][h]['bf16']['context_tokens_per_s']:.2f}x)")
        pre = v["prefill"]
        cells.append("-" if not pre else f"{best(pre, 'fp8_token', 'tflop_s')} "
                     f"({best(pre, 'fp8_token', 'tflop_s') / best(ref['prefill'], 'bf16', 'tflop_s'):.2f}x)")
        rows.append([f"`{variant}`"] + cells)
    rows.append(["bf16 pool"] + [f"{ref['decode'][h]['bf16']['context_tokens_per_s']:,} (1x)" for h in heads]
                + [f"{best(ref['prefill'], 'bf16', 'tflop_s')} (1x)"])
    return table(["variant of `attend_tile`'s FP8 branch"] + [f"decode {h}, context tokens / s (vs bf16)"
                                                            for h in heads]
                 + ["prefill {} x ({:,} + {:,}), TFLOP/s (vs bf16)".format(*PREFILL_SHAPE)], rows)


def identity_summary(runs: dict, engines: list[str]) -> dict:
    """The fp32 identity check from its engines' tokens (`identity_runs`: one part per engine, the torch path
    first): per engine, the requests whose greedy tokens equal the torch path's and the first token where each
    request differs (None: it does not); the engines of `engines` that did not finish."""
    tokens = {name: r["tokens"] for name, r in runs.items() if "tokens" in r}
    if "torch" not in tokens:
        raise RuntimeError("the torch path's run did not finish (see identity_runs)")
    ref = tokens["torch"]
    first = {name: [first_divergence(x, y) for x, y in zip(seqs, ref)] for name, seqs in tokens.items()
             if name != "torch"}
    missing = [name for name in engines if name not in tokens]
    same = {name: sum(f is None for f in fs) for name, fs in first.items()}
    eager = tokens.get(engines[0])  # the kernels launched one at a time: what capture, overlap and cascade must keep
    same_as_eager = {name: sum(x == y for x, y in zip(tokens[name], eager)) for name in engines[1:]
                     if name in tokens and eager is not None}
    return dict(requests=len(ref), new_tokens=len(ref[0]), identical_requests_vs_torch=same,
                first_divergence=first, missing=missing, identical_requests_vs_eager_kernels=same_as_eager,
                all_identical=not missing and all(n == len(ref) for n in same.values()))


def goals(res: dict) -> list[dict]:
    """The FP8 cache's targets, met or missed, from whatever parts of a GPU run (measure/fp8.py) are in `res`."""
    rows = []
    dec = res.get("decode", {}).get(DECODE_HEADS, {})
    if "fp8_token" in dec:
        ratio = dec["fp8_token"]["tokens_vs_bf16"]
        rows.append(dict(goal=f"decode ragged {DECODE_HEADS}: fp8 pool >= {DECODE_TARGET}x the bf16 pool's context "
                              "tokens/s", measured=ratio, met=ratio >= DECODE_TARGET))
    ext = res.get("extend", {}).get("uniform", {})
    if "fp8_token" in ext:
        ratio = ext["fp8_token"]["vs_bf16"]
        rows.append(dict(goal="extend over an fp8 prefix >= the bf16 pool's TFLOP/s", measured=ratio, met=ratio >= 1.0))
    cap = res.get("capacity", {})
    if "fp8" in cap and "preemptions" in cap["fp8"]:
        rows.append(dict(goal="capacity: the bf16 pool preempts, the fp8 pool of the same bytes does not",
                         measured=f"{cap['bf16']['preemptions']} / {cap['fp8']['preemptions']}",
                         met=cap["bf16"]["preemptions"] > 0 and cap["fp8"]["preemptions"] == 0))
    if "torch" in res.get("identity_runs", {}):
        ident = identity_summary(res["identity_runs"], IDENTITY_ENGINES)
        same = ", ".join(f"{name} {n}/{ident['requests']}" for name, n in ident["identical_requests_vs_torch"].items())
        rows.append(dict(goal="fp32: the kernels' fp8 tokens = the torch path's, every engine",
                         measured=same + "".join(f", {name} not run" for name in ident["missing"]),
                         met=ident["all_identical"]))
        kept = ident["identical_requests_vs_eager_kernels"]
        if kept or (IDENTITY_ENGINES[0] in ident["missing"] and len(ident["missing"]) < len(IDENTITY_ENGINES)):
            rows.append(dict(goal="fp32: CUDA graphs, overlap and cascade keep the eager kernels' fp8 tokens",
                             measured=", ".join([f"{name} {n}/{ident['requests']}" for name, n in kept.items()]
                                                + [f"{name} not run" for name in ident["missing"]]),
                             met=not ident["missing"] and all(n == ident["requests"] for n in kept.values())))
    return rows


def pct(x: float) -> str:
    return f"{x:+.2%}"


def tradeoff(acc: dict) -> list[str]:
    """Per pool: bytes of a SmolLM2 block, and what the real model's answers lost against the fp32 cache."""
    f = acc["figures"]
    pools = f["capacity"]["smollm2_135m"]["pools"]
    rows = [["fp32 (the reference)", "-", f"{pools['fp32']['bytes_per_block']:,}", "-",
             f["perplexity_text"]["fp32"], "-", "-", f"{f['requests']} / {f['requests']}", "-"],
            ["bf16 (a GPU's pool; bytes only)", "-", f"{pools['bf16']['bytes_per_block']:,}", "1x", "-", "-", "-", "-",
             "-"]]
    for name, (scales, pool) in POOLS.items():
        v = f["variants"][name]
        first = "-" if v["first_divergence_median"] is None else v["first_divergence_median"]
        label = f"**{name}** (kept)" if name == KEPT else name
        rows.append([label, scales, f"{pools[pool]['bytes_per_block']:,}",
                     f"{pools['bf16']['bytes_per_block'] / pools[pool]['bytes_per_block']:.2f}x",
                     f"{v['perplexity']} ({pct(v['perplexity_change'])})", fmt(v["kl_mean"]),
                     f"{v['top1_agreement']:.2%}", f"{v['identical']} / {v['requests']}", first])
    return table(["pool", "scales", "bytes per 16-token block", "blocks per byte vs bf16", "perplexity",
                  "mean KL(fp32 ‖ fp8), nats", "top-1 agreement", "answers identical (64 tokens)",
                  "median first divergence (token)"], rows)


def capacity(acc: dict) -> list[str]:
    """Chapter 2's arithmetic for both layouts: bytes per block, blocks and tokens per GiB, requests that fit."""
    rows = []
    for model, cap in acc["figures"]["capacity"].items():
        tokens, gib = REQUESTS_OF[model]
        shape = f"{model.replace('_', ' ')} ({cap['layers']} layers x {cap['kv_heads']} KV heads x {cap['head_dim']})"
        for pool, c in cap["pools"].items():
            fit = c["blocks_per_gib"] * gib // cdiv(tokens, 16)
            rows.append([shape, pool, f"{c['bytes_per_block']:,}", f"{c['blocks_per_gib']:,}",
                         f"{c['tokens_per_gib']:,}", f"{fit:,} of {tokens:,} tokens in {gib} GiB"])
    return table(["model", "pool", "bytes per 16-token block", "blocks per GiB", "tokens per GiB",
                  "requests that fit"], rows)


def unit(acc: dict | None) -> str:
    """The FP8 unit's *Measured here*: what the real model loses under each pool, one table."""
    if acc is None:
        return f"No accuracy measurement committed yet: `{CPU_COMMAND}` writes it.\n"
    f = acc["figures"]
    caption = (f"SmolLM2-135M-Instruct in fp32 on a CPU, its pool in fp32 and in fp8 under four kinds of scales; "
               f"{f['requests']} requests of the course's workloads, greedy, up to {f['new_tokens']} new tokens; KL "
               f"and top-1 agreement over {f['positions_scored']:,} next-token distributions along the fp32 answers; "
               "perplexity of `long`'s reference manual:")
    return "\n".join([caption, ""] + tradeoff(acc) + [""])


def section(acc: dict | None, gpu: dict | None) -> str:
    """The lesson's block: the capacity arithmetic, the trade-off on the real model, and the GPU's headline."""
    if acc is None:
        return f"No accuracy measurement committed yet: `{CPU_COMMAND}` writes it.\n"
    f = acc["figures"]
    kept = f["variants"][KEPT]
    worst = max((v for v in f["variants"].values()), key=lambda v: v["perplexity_change"])
    lines = ["**What a GiB holds** (chapter 2's `bytes_per_block`, computing in bf16; the fp32 row is this CPU's "
             "pool):", ""] + capacity(acc) + [
        "", f"**What the real model loses**: SmolLM2-135M-Instruct in fp32 on this machine's CPU, the same engine "
        f"with its pool in fp32 and in fp8 under four scale granularities; {f['requests']} requests of the "
        f"workloads {', '.join(f'`{w}`' for w in f['workloads'])} (one round each), greedy, up to "
        f"{f['new_tokens']} new tokens, stopping at the end of turn; KL and top-1 agreement over the "
        f"{f['positions_scored']:,} next-token distributions along the fp32 answers (teacher forcing); perplexity of "
        f"the {f['perplexity_text']['tokens']:,}-token reference manual of `long` as plain text. Calibrated scales: "
        f"the largest |K| and |V| of each layer (and head) over the `{f['calibration']['workload']}` workload's "
        "prompts, mapped to 448.", ""] + tradeoff(acc) + [
        "", f"The pool the course keeps changes perplexity by {pct(kept['perplexity_change'])} against a target of "
        f"{pct(f['target_perplexity_change'])} ({met(abs(kept['perplexity_change']) <= f['target_perplexity_change'])}"
        f"); the static pools by up to {pct(worst['perplexity_change'])}. "
        f"{provenance([acc])}", ""]
    if gpu is None:
        lines += [f"On the GPU (not measured yet: `{GPU_COMMAND}` writes this page's GPU tables).", ""]
    else:
        dec = gpu.get("decode", {}).get("32/8x128", {})
        if "fp8_token" in dec:
            lines += [f"On the {gpu['machine']['gpu']}, the ragged decode batch (32 / 8 heads x 128) reads "
                      f"{dec['fp8_token']['tokens_vs_bf16']}x the tokens of context per second from the fp8 pool "
                      f"that it reads from the bf16 pool (this page's GPU tables).", ""]
    return "\n".join(lines)


def tables(gpu: dict | None, ab: dict | None = None) -> str:
    """The results page's GPU part: decode, extend and store over bf16 and fp8 pools, the ablation of the
    decode's FP8 branch (`ab`), the capacity workload, the fp32 identity, the targets."""
    lines = ["#### An FP8 KV cache", ""]
    if gpu is None:
        return "\n".join(lines + [f"No measurement committed yet: `{GPU_COMMAND}` on a GPU writes it.", ""])
    m = gpu["machine"]
    lines += [f"Measured on {m['gpu']} ({m['sms']} SMs), torch {m['torch']}, Triton {m['triton']}, by "
              + ", then ".join(f"`{c}`" for c in gpu["commands"]) + "."
              + (f" Merged: {gpu['merge_note']}." if "merge_note" in gpu else ""), ""]
    rows = []
    for heads, r in gpu.get("decode", {}).items():
        if "error" in r:
            rows.append([heads, f"failed: {r['error']}"] + [""] * 6)
            continue
        for pool in ("bf16", "fp8_token", "fp8_static"):
            x = r[pool]
            rows.append([heads, pool.replace("_", ", "), f"{x['context_tokens_per_s']:,}",
                         "-" if pool == "bf16" else f"**{x['tokens_vs_bf16']}x**", x["tb_s"], x["copy_tb_s"],
                         f"{x['bytes'] / 2**20:,.0f}", f"{x['rel_err']:.1e}"])
    if rows:
        lines += ["**Decode, the ragged batch** (64 contexts from 1..8,192 tokens, blocks of 16), bf16 queries, the "
                  "same K/V in each pool, each checked against fp32 attention over the values its pool holds, median "
                  "of CUDA-graph replays; bytes are K/V with their scales, q and the output:", ""]
        lines += table(["heads", "pool", "context tokens / s", "vs bf16", "TB/s", "copy of the same bytes, TB/s",
                        "MiB read", "rel. error"], rows) + [""]
    ext = gpu.get("extend", {})
    rows = []
    for name in ("uniform", "ragged"):
        r = ext.get(name)
        if r and "error" not in r:
            rows.append([name, r["batch"], max(r["prefixes"]), max(r["news"]), r["bf16"]["tflop_s"],
                         f"{r['fp8_token']['tflop_s']} ({r['fp8_token']['vs_bf16']}x)",
                         f"{r['fp8_static']['tflop_s']} ({r['fp8_static']['vs_bf16']}x)"])
    if rows:
        lines += ["**Prefill after an fp8 prefix** (32 / 8 heads x 128), TFLOP/s:", ""]
        lines += table(["batch", "sequences", "longest prefix", "most new tokens", "bf16 pool",
                        "fp8, per token and head", "fp8, static"], rows) + [""]
    if ab is not None:
        lines += [f"**Where the fp8 decode's time goes**, by ablation (`{ab['command']}` measures it): every variant "
                  "on the same tensors, its best tile; `no_scales` gives wrong answers and is timed only.", ""] + \
            ablation(ab) + ["", f"Provenance: {ab['provenance']}.", ""]
    store = ext.get("store")
    if store and "error" not in store:
        lines += [f"**store_kvcache**: bf16 {store['bf16']['gb_s']} GB/s; quantizing into fp8 "
                  f"{store['fp8_token']['gb_s']} GB/s (bytes read and written).", ""]
    cap = gpu.get("capacity", {})
    if "bf16" in cap and "tokens_per_s" in cap.get("bf16", {}):
        rows = [[pool, f"{c['pool_bytes'] / 2**30:.2f}", f"{c['blocks']:,} of {c['blocks_all_requests_need']:,}",
                 c["preemptions"], c["tokens_per_s"], c["latency_p50_s"], c["latency_p99_s"], c["ttft_p99_s"]]
                for pool, c in ((p, cap[p]) for p in ("bf16", "fp8"))]
        lines += [f"**The same bytes, bf16 and fp8**: {cap['requests']} requests ({cap['prompt_tokens']:,} prompt "
                  f"tokens, {cap['new_tokens']} new each) at once through chapter 5's engine on the kernels (CUDA "
                  "graphs, fused, overlapped), SmolLM2's shape, random weights, bf16; the budget is "
                  f"{cap['budget']['budget_of_bf16_need']:.0%} of what the bf16 pool needs to hold them all; median of "
                  "three interleaved rounds:", ""]
        lines += table(["pool", "GiB", "blocks (all requests need)", "preemptions", "tokens / s", "p50 latency (s)",
                        "p99 latency (s)", "p99 TTFT (s)"], rows) + [""]
    if "torch" in gpu.get("identity_runs", {}):
        ident = identity_summary(gpu["identity_runs"], IDENTITY_ENGINES)
        kept = ident["identical_requests_vs_eager_kernels"]
        rows = [[name, f"{same}/{ident['requests']}", ", ".join("-" if f is None else str(f)
                                                                for f in ident["first_divergence"][name]),
                 f"{kept[name]}/{ident['requests']}" if name in kept else "-"]
                for name, same in ident["identical_requests_vs_torch"].items()]
        unfinished = f"; not finished in the run's time: {', '.join(ident['missing'])}" if ident["missing"] else ""
        lines += [f"**fp32, an fp8 pool, SmolLM2's shape** ({ident['requests']} requests of about 1,550 tokens behind "
                  f"a shared system prompt, {ident['new_tokens']} greedy tokens): the kernels' tokens against the "
                  f"torch path's and against the eager kernels', request by request{unfinished}:", ""]
        lines += table(["engine", "requests identical to the torch path's", "first differing token, per request",
                        "identical to the eager kernels'"], rows) + [""]
    pb = gpu.get("pool_bytes")
    if pb and "error" not in pb:
        layers = pb["layers"]
        first = next((r for r in layers if r["bytes_differing"]), None)
        if first is None:
            parted = "every layer holds the same bytes and scales"
        else:
            same = {0: "", 1: "layer 0 holds the same bytes and scales; "}.get(
                first["layer"], f"layers 0..{first['layer'] - 1} hold the same bytes and scales; ")
            last = layers[-1]
            share = last["bytes_differing"] / pb["bytes_written"]
            parted = (f"{same}layer {first['layer']} differs in {first['bytes_differing']:,} bytes, layer "
                      f"{last['layer']} in {last['bytes_differing']:,} ({share:.1%})")
        lines += [f"**Where the two paths part** (`--parts pool_bytes`): after one {pb['prompt_tokens']:,}-token "
                  f"prefill in fp32, the torch path's fp8 pool against the kernels', {pb['bytes_written']:,} e4m3 "
                  f"bytes of K and V a layer: {parted}. Each layer's input carries the last-bit differences of two "
                  "correct attention computations (a different order of additions), and e4m3's 3-bit mantissa turns a "
                  "few of them into a whole step; a random-weight model's near-flat logits then pick another token.",
                  ""]
    rows = [[g["goal"], g["measured"], met(g["met"])] for g in goals(gpu)]  # judged on the data, not the run
    lines += table(["target", "measured", "verdict"], rows) + [""] if rows else []
    return "\n".join(lines)
