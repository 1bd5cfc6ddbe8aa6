"""`python -m course homework timings` and the instructors' table it feeds: check's time per chapter, measured on
the reference (course/homework_tool/timings.py), rendered by `python -m course report --write` into
instructors/README.md from instructors/check_times.json (benchmarks/check_times.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import check_times, reporting
from course import homework_tool as hw
from course.homework_tool import timings

RECORD = {
    "date": "2026-01-02 03:04 UTC", "command": "python -m course homework timings", "commit": "0123456789abcdef",
    "timeout": 60.0,
    "machine": {"cpu": "Some CPU @ 2.00GHz", "cores": 2, "load_avg_1m_at_start": 0.12, "load_avg_1m_at_end": 1.5,
                "python": "3.11.9", "torch": "2.5.1"},
    "chapters": {
        "step01_kvcache": {"tasks": 4, "points": 8, "tests": 61,
                           "check": {"wall_s": 41.2, "tests_s": 30.1, "tests": 61, "passed": 61, "skipped": 0,
                                     "failed": 0},
                           "scored_only": {"wall_s": 12.6, "tests_s": 5.0, "tests": 40, "passed": 40, "skipped": 0,
                                           "failed": 0}},
        "step06_triton": {"tasks": 7, "points": 14, "tests": 90,
                          "check": {"wall_s": 125.4, "tests_s": 110.0, "tests": 90, "passed": 70, "skipped": 20,
                                    "failed": 0},
                          "scored_only": {"wall_s": 64.0, "tests_s": 50.0, "tests": 60, "passed": 50, "skipped": 10,
                                          "failed": 0}}}}


def test_the_table_is_rendered_from_the_json():
    text = check_times.render(RECORD)
    assert text.startswith("Measured by `python -m course homework timings` on 2026-01-02 at commit 0123456: "
                           "Some CPU @ 2.00GHz, 2 cores (load 0.12 at the start, 1.5 at the end), Python 3.11.9, "
                           "torch 2.5.1.")
    assert "`--timeout 60` per test" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows == [
        "| chapter | tasks | tests | `check` | `check --scored-only` | tagged tests |",
        "| step01 | 4 (8 points) | 61 | 41 s | 13 s | 40 |",
        "| step06 | 7 (14 points) | 90 | 2 min 05 s | 1 min 04 s | 60 |",
        "| all |  |  | 2 min 47 s | 1 min 17 s |  |"]
    missing = check_times.render(None)
    assert "No measurement" in missing and "python -m course homework timings" in missing


def test_the_instructors_guide_shows_the_committed_measurement():
    guide = check_times.guide_path()
    if not guide.is_file():
        pytest.skip("a student edition: no instructors' guide")
    block = reporting.readme_block(guide.read_text(), check_times.BEGIN, check_times.END)
    assert block == check_times.render(check_times.load()), \
        "instructors/README.md's check-times block is stale: run `python -m course report --write`"


def test_timings_measures_check_on_the_reference(course: Path, tmp_path: Path, capsys):
    output = tmp_path / "times.json"
    assert hw.main(["timings", "step91", "--root", str(course), "--output", str(output)]) == 0
    assert "now run: python -m course report --write" in capsys.readouterr().out
    record = json.loads(output.read_text())
    assert record["command"] == "python -m course homework timings step91" and record["timeout"] == 60
    assert {"cpu", "cores", "python", "torch", "load_avg_1m_at_start", "load_avg_1m_at_end"} <= set(record["machine"])
    [(name, chapter)] = record["chapters"].items()
    assert (name, chapter["tasks"], chapter["points"], chapter["tests"]) == ("step91_fake", 2, 2, 5)
    assert chapter["check"]["passed"] == 5 and chapter["scored_only"]["tests"] == 4  # the untagged test left out
    assert chapter["check"]["wall_s"] > 0 and chapter["scored_only"]["wall_s"] > 0
    assert check_times.render(record).count("| step91 | 2 (2 points) | 5 |") == 1


def test_a_reference_that_does_not_score_full_points_is_not_timed(course: Path):
    mathy = course / "step91_fake" / "mathy.py"
    mathy.write_text(mathy.read_text().replace("return total * scale", "return total * scale + 1"))
    with pytest.raises(hw.CheckError, match=r"step91's reference scored 1/2"):
        timings.measure(["step91"], course, log=lambda _: None)
    with pytest.raises(hw.CheckError, match="unknown chapter 'step99'"):
        timings.measure(["step99"], course)
