"""The chapter's numbers and pictures come from code: the results page's block is what `report.py` prints from
the committed JSON, the split-KV figure cuts the context as the kernel does (tests/test_figures.py checks that the
committed figure is what `pictures.py` draws), and the demo agrees with chapter 1."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from benchmarks import reporting as course_report
from benchmarks.step06 import report
from step06_triton import pictures
from tests.driver import demo_answer_matches_step01


def test_readme_results_are_the_reports_output():
    page = report.PAGE.read_text()
    assert report.readme_block(page) == report.block(report.load(), report.engine_report.load()), \
        "RESULTS.md's results block is stale: run `python -m benchmarks.step06.report --write`"
    rule = course_report.page_with(report.CHAPTER, report.RULE[0]).read_text()
    assert course_report.readme_block(rule, *report.RULE) == report.split_rule(report.load()), \
        "the launch-rule numbers are stale: run `python -m benchmarks.step06.report --write`"


def test_every_target_is_stated_with_its_measurement():
    """The kernels' targets as their run judged them; the engine's and cascade's judged from the data by the
    report (so a target changed since a run is judged on the numbers, not on the run's own verdict)."""
    from benchmarks.reporting import fmt
    from benchmarks.step06 import cascade, cascade_report, engine

    res, e = report.load(), report.engine_report.load()
    goals = res["kernels"]["goals"] + engine.goals({k: v for k, v in e.items() if k in ("smollm2_135m",
                                                                                       "llama_3_2_1b")},
                                                   report.fastest_copy(res))
    goals += cascade.goals(cascade_report.load())
    assert len(goals) >= 9 + 10 + 4 and all(g["measured"] is not None for g in goals)
    assert e["identity_fp32"]["all_identical"], "fp32 tokens differ between the engines or the tiers on the GPU"
    block = report.block(res, e) + report.more()  # the two results pages' tables
    missing = [g["goal"] for g in goals if f"| {g['goal']} | {fmt(g['measured'])} |" not in block]
    assert not missing, f"goals missing from the results pages: {missing}"


def test_roofline_plot_renders_from_the_json(tmp_path):
    report.plot(report.load(), tmp_path / "roofline.svg")
    assert (tmp_path / "roofline.svg").read_text().lstrip().startswith("<?xml")
    assert (report.RESULTS / "roofline.svg").is_file()


@pytest.mark.parametrize("seq_len,splits,block_n", [(70, 4, 32), (1, 3, 16), (64, 2, 16), (1000, 7, 64)])
def test_splits_cover_the_context_in_whole_tiles(seq_len, splits, block_n):
    ranges = pictures.split_ranges(seq_len, splits, block_n)
    covered = [i for start, end in ranges for i in range(start, end)]
    assert covered == list(range(seq_len)), "every token in exactly one split, in order"
    assert all(start % block_n == 0 for start, end in ranges if end > start)


def test_a_block_table_too_short_is_rejected():
    with pytest.raises(ValueError, match="cannot hold"):
        pictures.split_kv_dot([0], seq_len=20, block_size=16, num_splits=2, block_n=16, num_blocks=2)


@pytest.mark.slow
def test_demo_answer_matches_step01(real_model, capsys):
    """Through the interpreter on a CPU: the real model on the Triton kernels says what chapter 1 says."""
    from step06_triton.__main__ import main

    demo_answer_matches_step01(main, capsys, new_tokens=8)


@pytest.mark.slow
def test_smollm2_architecture_constant_matches_the_gguf():
    import gguf

    from step01_kvcache.pretrained import config_from_gguf, gguf_path
    from step01_kvcache.tiny import SMOLLM2_135M, tiny_config

    real = asdict(config_from_gguf(gguf.GGUFReader(str(gguf_path()))))
    assert real == pytest.approx(asdict(tiny_config(**SMOLLM2_135M)), rel=1e-6)  # the GGUF stores eps in fp32


def test_the_long_benchmark_puts_its_runners_side_by_side():
    from benchmarks.step06.engine_report import warm_request_rows
    fused = dict(cold_median_ms=7.0, warm_median_ms=3.0, warm_forward_gpu_us=1370.0, host_us_per_warm_request=1650.0,
                 warm_kernels=dict(kernels=340, gpu_us=1200.0, top=[["extend_attention_kernel", 30, 600.0]]))
    assert warm_request_rows({"cache_on": fused}) == [], "one runner: the paragraph above says it all"
    rows = warm_request_rows({"cache_on": fused, "cache_on_compiled": dict(error="BackendCompilerFailed: x")})
    assert "| hand-fused graphs | 7.0 | **3.0** | 1370.0 | 1650.0 | 340 (1200.0) |" in rows[2]
    assert "`extend_attention_kernel` 30, 600.0" in rows[2]
    assert rows[3].startswith("| compiled graphs | failed: BackendCompilerFailed")


def test_flashinfer_cells_add_the_per_layer_anchor_where_it_was_measured():
    key = report.row_key("9/3x64", True, 64, 8192, 16)
    row = dict(heads="9/3x64", ragged=True, batch=64, context=8192, block_size=16)
    old = {f"{who}_{mode}_tb_s": i for i, (who, mode) in enumerate(
        (w, m) for w in ("flashinfer", "triton") for m in ("graph", "eager"))}
    modes = report._anchor_modes({"decode": {key: old}})
    assert modes == ["graph", "eager"] and report._anchor({"decode": {key: old}}, row, modes) == "0 / 1 | 2 / 3"
    new = {**old, "flashinfer_eager_per_layer_tb_s": 1.5, "triton_eager_per_layer_tb_s": 3.5}
    modes = report._anchor_modes({"decode": {key: new}})
    assert modes == ["graph", "eager", "eager_per_layer"]
    assert report._anchor({"decode": {key: new}}, row, modes) == "0 / 1 / 1.5 | 2 / 3 / 3.5"
