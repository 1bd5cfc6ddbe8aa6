"""Every number in a README comes from data: each chapter's results block (in its README, a unit or its results page)
is exactly what `python -m course report` draws from the committed results/*.json, its plots are committed next to
the data and shown on a page of the chapter, and a missing
file is a clear error that names the command to run. Every chapter's report registers itself."""
from __future__ import annotations

import re

import pytest

from benchmarks import reporting
from course import report, results
from course.chapters import chapters
from course.paths import REPO_ROOT

STALE = "is stale: run `python -m course report --write` (or `make bench` for new numbers)"


REPORTS = report.reports()


def test_every_chapter_registers_a_report():
    assert list(REPORTS) == [c.split("_")[0] for c in chapters()]


@pytest.mark.parametrize("chapter", list(REPORTS))
def test_chapter_block_is_the_reports_output(chapter):
    folder = results.chapter_dir(chapter)
    text, plots = REPORTS[chapter].render()
    page = reporting.page_with(folder, REPORTS[chapter].begin)
    assert reporting.readme_block(page.read_text(), REPORTS[chapter].begin) == text, \
        f"{chapter}'s results block in {page.name} {STALE}"
    for (begin, end), section in (REPORTS[chapter].sections() if REPORTS[chapter].sections else {}).items():
        page = reporting.page_with(folder, begin)
        assert reporting.readme_block(page.read_text(), begin, end) == section, \
            f"{chapter}'s block {begin} in {page.name} {STALE}"
    shown = "".join(p.read_text() for p in folder.glob("*.md"))
    for name in plots:
        assert f"](results/{name})" in shown, f"{chapter}: plot {name} is drawn but not shown"
        assert (results.chapter_dir(chapter) / "results" / name).is_file(), f"results/{name} {STALE}"


def test_root_overview_is_the_reports_output():
    overview = report.overview(REPORTS)
    assert reporting.readme_block((REPO_ROOT / "README.md").read_text()) == overview, f"README.md {STALE}"


@pytest.mark.parametrize("chapter", list(REPORTS))
def test_plots_draw_from_the_data(chapter, tmp_path):
    _, plots = REPORTS[chapter].render()
    for name, draw in plots.items():
        draw(tmp_path / name)
        svg = (tmp_path / name).read_text()
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg and len(svg) < 400_000


def test_every_saved_run_names_its_machine_and_command():
    for path in sorted(REPO_ROOT.glob("step0[1-5]_*/results/*.json")):
        record = results.load(path.parent.parent.name, path.stem)
        assert re.fullmatch(r"step0[1-5]", record["chapter"]), path
        assert record["command"].startswith("python -m "), path
        assert {"cpu", "cores", "torch", "load_avg_1m_at_start", "load_avg_1m_at_end"} <= set(record["machine"]), path


def test_hugging_face_baselines_are_sdpa():
    for path in sorted(REPO_ROOT.glob("step0[1-5]_*/results/*.json")):
        figures = results.load(path.parent.parent.name, path.stem)["figures"]
        if any(k.startswith("hf_") for k in figures):
            assert figures["hf_attention"] == "sdpa", path


def test_missing_results_name_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "chapter_dir", lambda chapter: tmp_path)
    monkeypatch.setattr(reporting, "REPO_ROOT", tmp_path.parent)
    with pytest.raises(reporting.MissingResults, match="make bench"):
        REPORTS["step01"].render()


def test_unknown_chapter_is_refused(capsys):
    with pytest.raises(SystemExit):
        report.main(["step09"])
    assert "no report for step09" in capsys.readouterr().err
