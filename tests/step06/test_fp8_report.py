"""The FP8 cache's numbers in the lesson come from data: the trade-off block is what measure/fp8_report.py draws from
results/fp8.json (the accuracy bench's record: one row per pool, the kept one within its target), and the GPU's
tables render from a result shaped as measure/fp8.py writes it (the H200 run is committed separately; until then
the block says which command writes it)."""
from __future__ import annotations

import pytest

from benchmarks.step06 import fp8_report
from benchmarks.step06.fp8_accuracy import VARIANTS


def pool_row(ratio: float) -> dict:
    return dict(rel_err=0.004, ms=0.1, bytes=2**28, context_tokens_per_s=3_000_000_000, tb_s=3.5, copy_tb_s=4.1,
                tokens_vs_bf16=ratio)


@pytest.fixture
def gpu() -> dict:
    """A result shaped as `python -m benchmarks.step06.fp8` writes it (numbers made up)."""
    extend = dict(batch=4, prefixes=[4096] * 4, news=[2048] * 4, flops=1, bf16=dict(rel_err=0.003, tflop_s=400.0),
                  fp8_token=dict(rel_err=0.004, tflop_s=401.0, vs_bf16=1.002),
                  fp8_static=dict(rel_err=0.004, tflop_s=402.0, vs_bf16=1.005))
    capacity = {pool: dict(bytes_per_block=b, blocks=n, pool_bytes=n * b, blocks_all_requests_need=3000, wall_s=9.0,
                           tokens_per_s=t, preemptions=p, peak_blocks=n, latency_p50_s=5.0, latency_p99_s=9.0,
                           ttft_p50_s=0.5, ttft_p99_s=3.0)
                for pool, b, n, t, p in (("bf16", 368640, 1950, 1800.0, 41), ("fp8", 195840, 3670, 2500.0, 0))}
    res = dict(machine=dict(gpu="NVIDIA H200", sms=132, torch="2.11", triton="3.6"),
               commands=[fp8_report.GPU_COMMAND],
               identity_runs={name: dict(tokens=[[1, 2, 3]] * 8) for name in ["torch", *fp8_report.IDENTITY_ENGINES]},
               decode={"32/8x128": dict(bf16=pool_row(1.0), fp8_token=pool_row(1.86), fp8_static=pool_row(1.95)),
                       "9/3x64": dict(error="RuntimeError: out of memory")},
               extend=dict(uniform=extend, ragged=extend, store=dict(bf16=dict(correct=True, gb_s=2000.0),
                                                                     fp8_token=dict(correct=True, gb_s=1500.0))),
               capacity=dict(capacity, requests=64, prompt_tokens=40000, new_tokens=256, budget_bytes=1,
                             budget=dict(budget_of_bf16_need=0.65), speedup=1.39))
    return res


def test_the_gpu_tables_state_every_target_and_a_failed_part(gpu):
    text, goals = fp8_report.tables(gpu), fp8_report.goals(gpu)
    assert [g["met"] for g in goals] == [True] * 5
    assert all(f"| {g['goal']} |" in text for g in goals)
    assert "**1.86x**" in text and "failed: RuntimeError" in text and "| 41 |" in text
    assert fp8_report.GPU_COMMAND in fp8_report.tables(None)


def test_the_lessons_block_is_drawn_from_the_accuracy_record(gpu):
    acc = fp8_report.load_accuracy()
    assert acc is not None, f"results/fp8.json is missing: {fp8_report.CPU_COMMAND}"
    figures = acc["figures"]
    assert list(figures["variants"]) == list(VARIANTS) and fp8_report.KEPT == next(iter(VARIANTS))
    text = fp8_report.section(acc, None)
    assert text.count("\n| ") >= len(VARIANTS) + 2 + 2 * 4, "the trade-off rows and the capacity rows"
    assert fp8_report.GPU_COMMAND in text and "1.86x" in fp8_report.section(acc, gpu)
    kept = figures["variants"][fp8_report.KEPT]
    assert abs(kept["perplexity_change"]) <= figures["target_perplexity_change"], \
        "the pool the lesson keeps no longer meets its perplexity target: revisit the choice"


def test_an_engine_that_differs_or_did_not_run_misses_the_identity_target(gpu):
    """The identity target is judged from the engines' tokens: one request differing at its second token, or an
    engine whose run never finished, is a miss that the targets table states."""
    runs = gpu["identity_runs"]
    runs["triton"] = dict(tokens=[[1, 9, 3]] + [[1, 2, 3]] * 7)
    del runs["triton_graphs_fused_cascade"]
    ident = fp8_report.identity_summary(runs, fp8_report.IDENTITY_ENGINES)
    assert ident["first_divergence"]["triton"] == [1] + [None] * 7
    assert ident["missing"] == ["triton_graphs_fused_cascade"] and not ident["all_identical"]
    row = next(g for g in fp8_report.goals(gpu) if g["goal"].startswith("fp32"))
    assert not row["met"] and "triton 7/8" in row["measured"] and "not run" in row["measured"]
    assert "| **missed** |" in fp8_report.tables(gpu)


def test_a_graph_engine_that_parts_from_the_eager_kernels_misses_its_target(gpu):
    """Capture, overlap and cascade must keep the eager kernels' tokens: one request that differs is a miss."""
    gpu["identity_runs"]["triton_graphs_fused_cascade"] = dict(tokens=[[1, 2, 4]] + [[1, 2, 3]] * 7)
    ident = fp8_report.identity_summary(gpu["identity_runs"], fp8_report.IDENTITY_ENGINES)
    assert ident["identical_requests_vs_eager_kernels"] == {"triton_graphs_fused_overlap": 8,
                                                             "triton_graphs_fused_cascade": 7}
    row = next(g for g in fp8_report.goals(gpu) if g["goal"].startswith("fp32: CUDA graphs"))
    assert not row["met"] and "triton_graphs_fused_cascade 7/8" in row["measured"]


def test_the_pool_bytes_sentence_names_the_first_layer_that_differs(gpu):
    layers = [dict(layer=i, bytes_differing=n, scales_differing=n, largest_scale_difference=0.0)
              for i, n in enumerate((0, 0, 12, 300))]
    gpu["pool_bytes"] = dict(prompt_tokens=1540, head_rows_written=4620, bytes_written=1000, layers=layers)
    text = fp8_report.tables(gpu)
    assert "layers 0..1 hold the same bytes and scales; layer 2 differs in 12 bytes, layer 3 in 300 (30.0%)" in text


def test_the_ablation_table_orders_the_variants_and_reports_a_failed_one():
    ab = fp8_report.load_ablation()
    assert ab is not None, "results/h200_fp8_ablation.json is missing: python -m benchmarks.step06.fp8_ablation"
    ab["variants"]["normalised_weights"] = dict(error="Traceback ... RuntimeError: boom")
    text = "\n".join(fp8_report.ablation(ab))
    assert "| `normalised_weights` | failed: Traceback ... RuntimeError: boom |" in text
    assert text.index("`kernel`") < text.index("`no_scales`") < text.index("bf16 pool")
