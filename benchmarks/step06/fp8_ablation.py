"""`python -m benchmarks.step06.fp8_ablation [--out FILE]`: where the FP8 decode's time goes, by ablation.

Each variant is `attend_tile`'s FP8 branch changed in a copy of the chapter's package (decode_attention.py patched as
`VARIANTS` says), run in a process of its own, on the same tensors:
- `kernel`: the chapter's kernel, V's scales folded into the softmax weights (a [rows, BLOCK_N] multiply);
- `scales_on_v_tile`: V's [BLOCK_N, HEAD_DIM] tile multiplied by its scales before the second product (the first
  version of the kernel);
- `normalised_weights`: the weights divided by the tile's largest V scale, which multiplies the tile's product back
  (it would guard fp16 against V scales under 6e-5, at one more pass over the accumulator a tile);
- `no_scales`: no scale arithmetic at all, wrong answers and timed only: what the conversions of e4m3 to fp16 and
  the registers of the converted tiles leave, the bound of any placement of the scales.
Parts: the ragged decode of measure/fp8.py (both head shapes, a few tiles each, the bf16 pool once as the
yardstick), context tokens per second; prefill after an fp8 prefix (4 x (4,096 + 2,048)), three tiles, TFLOP/s.
Every variant but `no_scales` is checked against fp32 attention over the values its pool holds before it is timed.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "step06_triton"  # the chapter whose kernel is patched
KERNEL_V = ("        v = v.to(q.dtype)\n        v_weight = tl.load(v_scale_ptr + scale_at) * VALUE_SCALE\n")
VARIANTS = {
    "kernel": [],
    "scales_on_v_tile": [(KERNEL_V, "        v = v.to(q.dtype) * tl.load(v_scale_ptr + scale_at).to(q.dtype)[:, None]\n"
                                    "        v_weight = tl.full([BLOCK_N], VALUE_SCALE, tl.float32)\n")],
    "normalised_weights": [
        (KERNEL_V, KERNEL_V + "        v_max = tl.max(v_weight, 0)\n        v_weight = v_weight / v_max\n"),
        ("        v_weight = tl.full([BLOCK_N], 1.0, tl.float32)",
         "        v_max = 1.0\n        v_weight = tl.full([BLOCK_N], 1.0, tl.float32)"),
        ("    return online_softmax(m_i, l_i, acc, s, v, v_weight, sm_scale_log2, IEEE)\n",
         "    m_i, l_i, acc = online_softmax(m_i, l_i, acc / v_max, s, v, v_weight, sm_scale_log2, IEEE)\n"
         "    return m_i, l_i, acc * v_max\n")],
    "no_scales": [(KERNEL_V, "        v = v.to(q.dtype)\n"
                             "        v_weight = tl.full([BLOCK_N], VALUE_SCALE, tl.float32)\n"),
                  ("        s = s * tl.load(k_scale_ptr + scale_at)[None, :]\n", "")],
}
DECODE_TILES = {"fp8_token": [(128, 4), (64, 4), (128, 2), (64, 2), (256, 8)], "fp8_static": [(128, 4), (64, 4)]}
PREFILL_TILES = [(128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 3)]  # (BLOCK_M, BLOCK_N, warps, stages)


def patched(variant: str, root: Path) -> Path:
    """A copy of the chapter's package under `root` with decode_attention.py changed as VARIANTS[variant] says."""
    shutil.copytree(PACKAGE, root / PACKAGE.name, ignore=shutil.ignore_patterns("results", "figures", "__pycache__"))
    source = root / PACKAGE.name / "decode_attention.py"
    text = source.read_text()
    for old, new in VARIANTS[variant]:
        if old not in text:
            raise RuntimeError(f"variant {variant}: the kernel no longer reads {old.strip()!r}")
        text = text.replace(old, new)
    source.write_text(text)
    return root


def measure(variant: str) -> dict:
    """In the variant's own process: the decode and prefill rows."""
    from step06_triton import decode_attention, extend_attention

    from . import kernels
    from .common import checked, median_ms
    from .fp8 import fp8_pools
    check = variant != "no_scales"
    out: dict = dict(decode={}, prefill={}, source=decode_attention.__file__)
    for heads in kernels.HEADS:
        _, hkv, d = kernels.HEADS[heads]
        x = kernels.ragged_decode_batch(heads, 16)
        lengths, tokens = x["lengths"], sum(x["lengths"])
        rows = out["decode"][heads] = {}
        for pool, (kc, vc, scales, kf, vf) in fp8_pools(x["k"], x["v"]).items():
            tiles = DECODE_TILES.get(pool, [None] if variant == "kernel" else [])
            for tile in tiles:
                launch = {} if tile is None else dict(block_n=tile[0], num_warps=tile[1])
                run = functools.partial(decode_attention.paged_decode_attention, x["q"], kc, vc, x["table"],
                                        x["seq_lens"], decode_attention.num_kv_splits(max(lengths)),
                                        kv_scales=scales, **launch)
                err = checked(run(), kernels.decode_reference(x["q"], kf, vf, x["table"], lengths, 16),
                              f"{variant} {heads} {pool}") if check else None
                ms = median_ms(run)
                name = pool if tile is None else f"{pool} {tile[0]}x{tile[1]}"
                rows[name] = dict(rel_err=err, ms=round(ms, 4), context_tokens_per_s=round(tokens / ms * 1e3),
                                  tb_s=round(kernels.kv_bytes(tokens, hkv, d, pool) / ms / 1e9, 3))
                print(variant, heads, name, rows[name], flush=True)
    batch, prefix, new = kernels.PREFILL_SHAPE
    x = kernels.extend_inputs([prefix] * batch, [new] * batch, 16)
    for pool, (kc, vc, scales, kf, vf) in fp8_pools(x["k"], x["v"]).items():
        if pool == "fp8_static" or (pool == "bf16" and variant != "kernel") or variant == "normalised_weights":
            continue
        for bm, bn, warps, stages in PREFILL_TILES:
            run = functools.partial(extend_attention.extend_attention, x["q"], kc, vc, x["table"], x["qsl"],
                                    x["seq_lens"], new, kv_scales=scales, block_m=bm, block_n=bn, num_warps=warps,
                                    num_stages=stages)
            err = kernels.check_prefill(run(), x, kf, vf, f"{variant} prefill {pool}", 16) if check else None
            name = f"{pool} {bm}x{bn} {warps}w {stages}s"
            out["prefill"][name] = dict(rel_err=err, tflop_s=round(x["flops"] / median_ms(run) / 1e9, 1))
            print(variant, "prefill", name, out["prefill"][name], flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the JSON here (step06_triton/results/h200_fp8_ablation.json)")
    ap.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args(argv)
    from .common import machine, needs_gpu
    if not needs_gpu("benchmarks.step06.fp8_ablation"):
        return 2
    if args.variant:
        print("RESULT " + json.dumps(measure(args.variant)), flush=True)
        return 0
    result: dict = dict(command="python -m benchmarks.step06.fp8_ablation " + " ".join(argv or sys.argv[1:]),
                        machine=machine(), variants={})
    for variant in VARIANTS:
        with tempfile.TemporaryDirectory() as tmp:
            root = patched(variant, Path(tmp))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(PACKAGE.parent),
                                                               os.environ.get("PYTHONPATH", "")]))
            proc = subprocess.run([sys.executable, "-m", "benchmarks.step06.fp8_ablation", "--variant", variant],
                                  env=env, cwd=root, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        result["variants"][variant] = (json.loads(lines[0][7:]) if lines else
                                       dict(error=(proc.stdout + proc.stderr)[-2000:]))
        print(variant, "done" if lines else f"failed:\n{proc.stderr[-2000:]}", flush=True)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
