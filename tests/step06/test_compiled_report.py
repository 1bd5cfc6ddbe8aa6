"""The compiled runner's results block and timeline picture (benchmarks/step06/compiled_report.py), from a result
shaped as `benchmarks.step06.compiled` writes it: its per-layer numbers come from the bench's own `timeline` over a
made-up kernel list, so the report reads exactly the keys the GPU run writes."""
from __future__ import annotations

import pytest

from benchmarks.step06 import compiled, compiled_report


def layer(names: list[str], start: float, us: float = 2.0, gap: float = 1.0) -> list[tuple[str, float, float]]:
    out = []
    for name in names:
        out.append((name, start, start + us))
        start += us + gap
    return out


def fake_run(per_layer: list[str], layers: int = 4) -> dict:
    kernels, t = [("embedding", 0.0, 1.0)], 2.0
    for _ in range(layers):
        kernels += layer(per_layer, t)
        t = kernels[-1][2] + 1.0
    kernels += layer(["rms_norm", "lm_head_gemm"], t)
    return dict(batch=64, split_axis=1, gpu_us_per_step=float(t), gpu_us_min=float(t) - 1, build_s=3.2,
                engine_step_ms_median=1.9, weight_bytes=1000, kv_bytes=10, copy_tb_s=3.9, floor_us=12.5,
                **compiled.timeline(kernels, layers))


@pytest.fixture
def result() -> dict:
    fused = fake_run(["store_kvcache", "decode_attention", "o_proj", "add_rms_norm", "gate_up", "silu_mul", "down",
                      "add_rms_norm", "qkv_rope"])
    comp = dict(fake_run(["store_kvcache", "decode_attention", "gemm", "triton_fused_0", "gemm", "gemm",
                          "triton_fused_1"]), compile_s=41.0, dynamic="unbacked", merged=True, dynamo_graphs=1)
    return {"chapter": "step06", "machine": dict(gpu="NVIDIA H100 80GB HBM3", date="2026-12-06"),
            "commands": ["python -m benchmarks.step06.compiled --out step06_triton/results/h100_compiled.json"],
            "versions": dict(python="3.12", torch="2.13.0", triton="3.6.0"), "copy_tb_s": 3.9,
            "smollm2_135m": {"fused_graphs": fused, "compiled_graphs": comp, "compiled_over_fused_us": 0.8,
                             "compiled_unmerged_graphs": {"error": "RuntimeError: planted"}},
            "identity_fp32": dict(requests=8, new_tokens=16, all_identical=True, compile_s=9.0, compiled_replays=30,
                                  identical_requests_vs_eager={"eager": 8, "fused_graphs": 8, "compiled_graphs": 8})}


def test_the_block_shows_both_runners_their_kernels_and_the_identity(result):
    text = compiled_report.tables(result)
    fused, comp = result["smollm2_135m"]["fused_graphs"], result["smollm2_135m"]["compiled_graphs"]
    assert fused["kernels_per_layer"] > comp["kernels_per_layer"], "the made-up compiled layer has fewer kernels"
    row = next(line for line in text.splitlines() if "compiled (Inductor)" in line)
    assert f"| {comp['kernels_per_step']} | {comp['kernels_per_layer']} |" in row and "| 41 |" in row
    assert "failed on this card (`RuntimeError: planted`)" in text, "a part that failed is said, not dropped"
    assert "0.8x the hand-fused step's GPU time" in text and "compiled_graphs 8/8" in text
    assert "h100_compiled.json" in text and compiled_report.FIGURE in text


def test_the_timeline_draws_one_row_per_runner_from_the_middle_layer(result, tmp_path):
    fig = compiled_report.layer_figure(result)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 2 and titles[0].startswith("hand-fused") and "9 kernels" in titles[0]
    assert "7 kernels" in titles[1], titles
    compiled_report.draw(result, tmp_path / "t.svg")
    assert (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")

