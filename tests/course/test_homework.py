"""The homework tool on a fake course built in tmp_path: stubs, markers, start, check (scores, loops, imports)."""
from __future__ import annotations

import ast
import json
import shutil
import time
from pathlib import Path

import pytest

from course import homework_tool as hw

from .conftest import MATHY


def _functions(source: str) -> list[tuple]:
    return [(n.name, ast.dump(n.args), [ast.dump(d) for d in n.decorator_list], ast.dump(n.returns),
             ast.get_docstring(n)) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)]


def test_stub_keeps_signatures_and_docstrings_and_raises_with_the_task_id():
    stub = hw.make_stub(MATHY, chapter="step91_fake")
    assert _functions(stub) == _functions(MATHY)
    assert hw.signatures(stub) == hw.signatures(MATHY)
    assert stub.count("# BEGIN SOLUTION") == 2 and stub.count("# END SOLUTION") == 2  # markers stay
    assert "total * scale" not in stub and "range(n)" not in stub
    namespace: dict = {}
    exec(compile(stub, "mathy.py", "exec"), namespace)
    with pytest.raises(NotImplementedError, match=r"^task91\.add: see step91_fake/README\.md#exercises$"):
        namespace["add"](1)
    with pytest.raises(NotImplementedError, match=r"^task91\.triangle: "):
        namespace["Counter"]().triangle(3)


def test_stub_only_the_given_tasks():
    stub = hw.make_stub(MATHY, only={"task91.triangle"})
    assert "total * scale" in stub and "range(n)" not in stub
    assert hw.make_stub(MATHY, only=set()) == MATHY


def test_signatures_see_a_changed_default():
    assert hw.signatures(MATHY.replace("b: int = 2", "b: int = 3")) != hw.signatures(MATHY)


def test_find_regions_names_the_enclosing_function():
    regions = hw.find_regions(MATHY, "mathy.py")
    assert [(r.task, r.function, r.begin) for r in regions] == [("task91.add", "add", 9),
                                                               ("task91.triangle", "Counter.triangle", 22)]


@pytest.mark.parametrize("source,error", [
    ("def f():\n    # BEGIN SOLUTION t.a\n    # BEGIN SOLUTION t.b\n    pass\n    # END SOLUTION\n", "x.py:3: .*nest"),
    ("def f():\n    # BEGIN SOLUTION t.a\n    pass\n", "x.py:2: .*never closed"),
    ("def f():\n    pass\n    # END SOLUTION\n", "x.py:3: END SOLUTION without"),
    ("def f():\n    # BEGIN SOLUTION\n    pass\n    # END SOLUTION\n", "x.py:2: .*task id"),
    ("def f():\n    # BEGIN SOLUTION t.a\n    pass\n# END SOLUTION\n", "x.py:4: .*indented differently"),
    ("def f():\n    # BEGIN SOLUTION t.a\n    pass\n    # END SOLUTION t.b\n", "x.py:4: .*closes the region of t.a"),
    ("# BEGIN SOLUTION t.a\nX = 1\n# END SOLUTION\n", "x.py:1: .*not inside a function"),
])
def test_bad_markers_are_clear_errors(source: str, error: str):
    with pytest.raises(hw.MarkerError, match=error):
        hw.make_stub(source, filename="x.py")


def test_bad_marker_in_a_chapter_leaves_no_copy(course: Path, tmp_path: Path):
    (course / "step91_fake" / "bad.py").write_text("def g():\n    # BEGIN SOLUTION t.x\n    return 1\n")
    with pytest.raises(hw.MarkerError, match=r"step91_fake/bad\.py:2:"):
        hw.start("step91", tmp_path / "hw", root=course)
    assert not (tmp_path / "hw" / "step91_fake").exists()


def test_start_copies_stubs_and_refuses_to_overwrite(course: Path, tmp_path: Path, capsys):
    dest = tmp_path / "hw"
    argv = ["start", "step91", "--dest", str(dest), "--root", str(course)]
    assert hw.main(argv) == 0
    out = capsys.readouterr().out
    assert "task91.add" in out and "mathy.py:9" in out and "Counter.triangle" in out
    copy = dest / "step91_fake" / "mathy.py"
    assert 'raise NotImplementedError("task91.add: see step91_fake/README.md#exercises")' in copy.read_text()

    copy.write_text(MATHY)  # the student's work
    assert hw.main(argv) == 2
    assert "--force" in capsys.readouterr().err
    assert copy.read_text() == MATHY
    assert hw.main([*argv, "--force"]) == 0
    assert copy.read_text() != MATHY
    assert hw.find_tasks("step91_fake", course).keys() == {"task91.add", "task91.triangle"}


def test_check_scores_zero_on_stubs_and_full_on_the_reference(course: Path, tmp_path: Path, capsys):
    hw.start("step91", tmp_path / "stubs", root=course)
    stubs = hw.check("step91", tmp_path / "stubs", timeout=10, root=course)
    assert (stubs["score"], stubs["max_score"], stubs["error"]) == (0, 2, None)
    add = next(t for t in stubs["tasks"] if t["id"] == "task91.add")
    assert (add["passed"], add["failed"], add["total"], add["points"]) == (0, 3, 3, 0)
    assert any("NotImplementedError: task91.add" in f["message"] for f in stubs["failures"])
    assert stubs["untagged"] == {"passed": 0, "failed": 1, "errors": 0, "skipped": 0, "total": 1}

    hw.start("step91", tmp_path / "ref", only=set(), root=course)
    assert hw.main(["check", "step91", "--json", "--dest", str(tmp_path / "ref"), "--root", str(course)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["chapter"], result["score"], result["max_score"]) == ("step91_fake", 2, 2)
    assert [(t["id"], t["passed"], t["total"], t["points"]) for t in result["tasks"]] == [
        ("task91.add", 3, 3, 1), ("task91.triangle", 1, 1, 1)]
    assert result["untagged"]["passed"] == 1


def test_one_task_right_scores_one_point(course: Path, tmp_path: Path, capsys):
    hw.start("step91", tmp_path / "hw", only={"task91.triangle"}, root=course)
    assert hw.main(["check", "step91", "--dest", str(tmp_path / "hw"), "--root", str(course)]) == 0
    out = capsys.readouterr().out
    assert "score: 1/2" in out and "task91.triangle" in out and "FAILED" in out


def test_an_infinite_loop_fails_its_test_within_the_timeout(course: Path, tmp_path: Path):
    copy = hw.start("step91", tmp_path / "hw", only=set(), root=course)
    mathy = copy / "mathy.py"
    mathy.write_text(mathy.read_text().replace("for i in range(n):", "for i in iter(int, 1):"))
    began = time.monotonic()
    result = hw.check("step91", tmp_path / "hw", timeout=2, root=course)
    assert time.monotonic() - began < 30
    [failure] = result["failures"]
    assert failure["outcome"] == "timeout" and failure["tasks"] == ["task91.triangle"]
    assert "Timeout" in failure["message"]
    assert result["score"] == 1  # the loop costs its own task only


def test_a_copy_that_does_not_import_is_reported_and_scores_zero(course: Path, tmp_path: Path, capsys):
    copy = hw.start("step91", tmp_path / "hw", only=set(), root=course)
    (copy / "__init__.py").write_text("from .mathy import add\n")
    (copy / "mathy.py").write_text("def add(a, b:\n    return a + b\n")
    assert hw.main(["check", "step91", "--json", "--dest", str(tmp_path / "hw"), "--root", str(course)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["score"] == 0 and result["max_score"] == 2
    assert "SyntaxError" in result["error"] and "mathy.py" in result["error"]
    assert len(result["error"].splitlines()) < 10  # a message, not a traceback wall


def test_a_chapter_is_checked_against_the_reference_of_the_others(course: Path, tmp_path: Path):
    """Stubs of step91 in the same homework folder must not break the grading of step92."""
    hw.start("step91", tmp_path / "hw", root=course)
    hw.start("step92", tmp_path / "hw", only=set(), root=course)
    result = hw.check("step92", tmp_path / "hw", timeout=10, root=course)
    assert (result["score"], result["max_score"]) == (1, 1)


def test_check_without_a_copy_or_with_an_unknown_chapter_cannot_run(course: Path, tmp_path: Path, capsys):
    assert hw.main(["check", "step91", "--dest", str(tmp_path / "none"), "--root", str(course)]) == 2
    assert "homework start step91" in capsys.readouterr().err
    assert hw.main(["start", "step99", "--dest", str(tmp_path / "hw"), "--root", str(course)]) == 2
    assert "step91_fake, step92_uses" in capsys.readouterr().err


def test_task_filter_and_unknown_tags(course: Path, tmp_path: Path):
    (course / "tests" / "step91" / "test_typo.py").write_text(
        'import pytest\n\n\n@pytest.mark.task("task91.ad")\ndef test_typo():\n    pass\n')
    hw.start("step91", tmp_path / "hw", only=set(), root=course)
    result = hw.check("step91", tmp_path / "hw", timeout=10, tasks=["task91.triangle"], root=course)
    assert [t["id"] for t in result["tasks"]] == ["task91.triangle"] and result["max_score"] == 1
    assert result["untagged"]["total"] == 0 and result["unknown_tasks"] == ["task91.ad"]


def test_a_test_module_that_cannot_be_collected_zeroes_every_task(course: Path, tmp_path: Path):
    (course / "tests" / "step91" / "test_broken.py").write_text("from step91_fake.mathy import gone\n")
    hw.start("step91", tmp_path / "hw", only=set(), root=course)
    result = hw.check("step91", tmp_path / "hw", timeout=10, root=course)
    assert result["score"] == 0 and "gone" in result["collect_errors"][0]["message"]


def test_an_import_that_loops_forever_is_reported(course: Path, tmp_path: Path):
    copy = hw.start("step91", tmp_path / "hw", only=set(), root=course)
    (copy / "__init__.py").write_text("while True:\n    pass\n")
    run = hw.plan("step91", tmp_path / "hw", timeout=2, root=course)
    run.import_timeout = 2
    [result] = hw.execute([run])
    assert result["score"] == 0 and "still running after" in result["error"]


def test_grading_the_reference_instead_of_the_copy_fails_loudly(course: Path, tmp_path: Path, capsys):
    """A conftest that re-imports the chapter from the course root must not go unnoticed."""
    (course / "tests" / "step91" / "conftest.py").write_text(
        "import sys\n\nfor name in [n for n in sys.modules if n.startswith('step91_fake')]:\n"
        "    del sys.modules[name]\nimport step91_fake.mathy  # noqa: E402\n")
    hw.start("step91", tmp_path / "hw", root=course)
    assert hw.main(["check", "step91", "--dest", str(tmp_path / "hw"), "--root", str(course)]) == 2
    assert "not graded against the copy" in capsys.readouterr().err


def _loop_in_add(copy: Path) -> None:
    """The copy's add() blocks SIGALRM, then loops forever: only a kill from outside stops it."""
    mathy = copy / "mathy.py"
    mathy.write_text(mathy.read_text().replace("total = a + b", "import signal\n    signal.pthread_sigmask("
                                                "signal.SIG_BLOCK, {signal.SIGALRM})\n    while True:\n        pass"))


def test_a_loop_that_blocks_the_timeout_signal_is_killed_by_the_grader(course: Path, tmp_path: Path):
    """The grader kills the test from outside after its timeout and a grace; the tests of its task are not run
    again, the others go on in a new worker, where the untagged test loops too and is killed the same way."""
    _loop_in_add(hw.start("step91", tmp_path / "hw", only=set(), root=course))
    began = time.monotonic()
    result = hw.check("step91", tmp_path / "hw", timeout=1, root=course, total_timeout=60)
    assert time.monotonic() - began < 60
    assert result["error"] is None
    first = result["failures"][0]
    assert first["outcome"] == "timeout" and "the grader killed its process" in first["message"]
    assert any(f["message"].startswith("not run") for f in result["failures"])
    untagged = [f for f in result["failures"] if f["nodeid"].endswith("::test_untagged")]
    assert [f["outcome"] for f in untagged] == ["timeout"]
    assert [(t["id"], t["points"]) for t in result["tasks"]] == [("task91.add", 0), ("task91.triangle", 1)]


def test_the_whole_check_stops_at_its_limit(course: Path, tmp_path: Path):
    """Tests that each stay within their own limit still cannot hold the check past the whole check's."""
    _loop_in_add(hw.start("step91", tmp_path / "hw", only=set(), root=course))
    began = time.monotonic()
    result = hw.check("step91", tmp_path / "hw", timeout=60, root=course, total_timeout=3)
    assert time.monotonic() - began < 30
    assert "time limit" in result["error"] and result["score"] == 0


def test_a_test_process_that_dies_fails_its_own_test(course: Path, tmp_path: Path):
    """A test that kills its process fails; a new one runs the others (not those of its task, already lost)."""
    copy = hw.start("step91", tmp_path / "hw", only=set(), root=course)
    mathy = copy / "mathy.py"
    mathy.write_text(mathy.read_text().replace("total = a + b", "import os\n    os._exit(3)"))
    result = hw.check("step91", tmp_path / "hw", timeout=10, root=course)
    assert result["error"] is None and result["tampering"] == []
    [died, *others] = [f for f in result["failures"] if "task91.add" in f["tasks"]]
    assert died["nodeid"].endswith("::test_add") and "died (exit code 3)" in died["message"]
    assert others and all(f["message"].startswith("not run") for f in others)
    assert [(t["id"], t["points"]) for t in result["tasks"]] == [("task91.add", 0), ("task91.triangle", 1)]


def test_start_warns_when_an_earlier_chapter_of_the_copy_is_still_a_stub(course: Path, tmp_path: Path, capsys):
    """A warning on stderr, not an error; `check` says the same in its notes (one place decides both)."""
    dest = tmp_path / "hw"

    def start(chapter: str) -> str:
        assert hw.main(["start", chapter, "--dest", str(dest), "--root", str(course), "--force"]) == 0
        return capsys.readouterr().err

    assert start("step92") == ""  # no copy of step91: step92 is checked against the course's own step91
    assert start("step91") == ""  # nothing before step91
    warning = start("step92")
    assert warning.startswith("warning: ") and warning.count("\n") == 1
    assert "your copy" in warning and "of step91_fake (which step92_uses builds on) still has stubs (task91.add, "\
        "task91.triangle)" in warning
    assert f"warning: {hw.plan('step92', dest, root=course).notes[0]}\n" == warning

    shutil.copytree(course / "step91_fake", dest / "step91_fake", dirs_exist_ok=True)  # step91 solved
    assert start("step92") == "" and hw.plan("step92", dest, root=course).notes == []


PAIR = '''\
class Pair:
    """Keeps values: `save` puts one in, `load` gives the last one back."""

    def __init__(self) -> None:
        self.items: list[int] = []

    def save(self, value: int) -> None:
        """Keep `value`."""
        # BEGIN SOLUTION task91.pair points=2
        self.items.append(value)
        # END SOLUTION

    def load(self) -> int:
        """The value kept last."""
        # BEGIN SOLUTION task91.pair points=2
        return self.items[-1]
        # END SOLUTION
'''


def test_check_names_the_body_of_a_task_that_failed(course: Path, tmp_path: Path, capsys):
    """task91.pair has two bodies: the report says which one is still a stub or, with none, which one raised."""
    (course / "step91_fake" / "pair.py").write_text(PAIR)
    (course / "tests" / "step91" / "test_pair.py").write_text(
        "import pytest\n\nfrom step91_fake.pair import Pair\n\n\n@pytest.mark.task('task91.pair')\n"
        "def test_pair():\n    p = Pair()\n    p.save(3)\n    assert p.load() == 3\n")
    copy = hw.start("step91", tmp_path / "hw", only=set(), root=course) / "pair.py"
    argv = ["check", "step91", "--task", "task91.pair", "--dest", str(tmp_path / "hw"), "--root", str(course)]

    def check() -> tuple[dict, str]:
        assert hw.main([*argv, "--json"]) == 0
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert hw.main(argv) == 0
        [row] = result["tasks"]
        return row, capsys.readouterr().out

    row, table = check()
    assert row["points"] == 2 and [(b["function"], b["stub"]) for b in row["bodies"]] == [
        ("Pair.save", False), ("Pair.load", False)]
    assert "->" not in table

    copy.write_text(PAIR.replace("return self.items[-1]",
                                 'raise NotImplementedError("task91.pair: see step91_fake/README.md#exercises")'))
    row, table = check()
    assert row["points"] == 0
    assert [(b["function"], b["file"], b["line"], b["stub"]) for b in row["bodies"]] == [
        ("Pair.save", "step91_fake/pair.py", 9, False), ("Pair.load", "step91_fake/pair.py", 15, True)]
    assert "-> still a stub: Pair.load (step91_fake/pair.py:15); written: Pair.save" in table

    copy.write_text(PAIR.replace("return self.items[-1]", "return self.items[1]"))  # written, wrong
    row, table = check()
    assert [(b["stub"], b["failing_tests"]) for b in row["bodies"]] == [(False, 0), (False, 1)]
    assert "-> failing tests raised in: Pair.load (step91_fake/pair.py:15), 1 test" in table
    gradescope = hw.main([*argv, "--format", "gradescope"])
    assert gradescope == 0 and "failing tests raised in: Pair.load" in capsys.readouterr().out


CHAIN = '''\
def first(x: int) -> int:
    """One more."""
    # BEGIN SOLUTION task91.first
    return x + 1
    # END SOLUTION


def second(x: int) -> int:
    """Twice one more."""
    # BEGIN SOLUTION task91.second
    return first(x) * 2
    # END SOLUTION
'''
CHAIN_TEST = ("import pytest\n\nfrom step91_fake.chain import second\n\n\n@pytest.mark.task('task91.second')\n"
              "def test_second():\n    assert second(1) == 4\n")


def test_the_report_names_the_tasks_a_task_needs(course: Path, tmp_path: Path, capsys):
    """task91.second is written but its test calls task91.first, still a stub: the check says what to solve first,
    in the table, the JSON (`needs`) and Gradescope's output. A traced run of the reference (the proof's) lists,
    per task, the other tasks whose bodies its tests ran, in this chapter or an earlier one (task92.double calls
    task91.add): what the Exercises tables' *needs* column must say. One worker runs the three checks."""
    from course.homework_tool.cli import _print_report
    from course.homework_tool.gradescope import gradescope

    (course / "step91_fake" / "chain.py").write_text(CHAIN)
    (course / "tests" / "step91" / "test_chain.py").write_text(CHAIN_TEST)
    copy = hw.start("step91", tmp_path / "student", root=course) / "chain.py"
    stub = 'raise NotImplementedError("task91.second: see step91_fake/README.md#exercises")'
    copy.write_text(copy.read_text().replace(stub, "return first(x) * 2"))
    runs = [hw.plan("step91", tmp_path / "student", timeout=30, tasks=["task91.second", "task91.add"], root=course)]
    for chapter in ("step91", "step92"):
        hw.start(chapter, tmp_path / "reference", only=set(), root=course)
        runs.append(hw.plan(chapter, tmp_path / "reference", timeout=30, root=course))
        runs[-1].trace = True
    result, first, second = hw.execute(runs)

    written, stubbed = result["tasks"]
    assert (written["points"], written["needs"]) == (0, ["task91.first"])
    assert (stubbed["points"], stubbed["needs"]) == (0, []), "a task's own stub is no other task it needs"
    assert "calls" not in written, "only a traced run (the proof's reference) records what the tests ran"
    _print_report(result, "step91")
    assert "-> needs task91.first (unsolved)" in capsys.readouterr().out
    [output] = [t["output"] for t in gradescope(result)["tests"] if t["name"] == "task91.second"]
    assert "needs task91.first (unsolved): solve it first" in output

    assert {r["id"]: r["calls"] for r in first["tasks"]} == {
        "task91.add": [], "task91.first": [], "task91.second": ["task91.first"], "task91.triangle": []}
    assert {r["id"]: r["calls"] for r in second["tasks"]} == {"task92.double": ["task91.add"]}


TWO = '''\
def double(x: int) -> int:
    """Twice x."""
    # BEGIN SOLUTION task91.twice
    return 2 * x
    # END SOLUTION


def succ(x: int) -> int:
    """One more."""
    # BEGIN SOLUTION task91.succ
    return x + 1
    # END SOLUTION
'''
TWO_TESTS = """import pytest

from step91_fake.two import double, succ


@pytest.mark.task("task91.twice")
def test_twice():
    assert double(3) == 6


@pytest.mark.task("task91.succ")
def test_succ():
    assert succ(3) == 4


@pytest.mark.task("task91.twice")
@pytest.mark.task("task91.succ")
def test_both():
    assert double(succ(1)) == 4
"""


def test_a_test_of_two_tasks_waits_for_the_unsolved_one(course: Path, tmp_path: Path, capsys):
    """test_both runs task91.twice and task91.succ and is tagged with both. With succ still a stub it waits, neutral,
    for twice, which earns its points on its own test (and the report says what test_both waits for); once succ is
    written it counts for both: a twice wrong only where test_both looks costs both their points. The traced
    reference lists no need between them: a test's own tags are no needs."""
    from course.homework_tool.cli import _print_report

    (course / "step91_fake" / "two.py").write_text(TWO)
    (course / "tests" / "step91" / "test_two.py").write_text(TWO_TESTS)
    copy = hw.start("step91", tmp_path / "alone", root=course) / "two.py"
    copy.write_text(copy.read_text().replace('raise NotImplementedError("task91.twice: see step91_fake/README.md'
                                             '#exercises")', "return 2 * x"))
    wrong = hw.start("step91", tmp_path / "wrong", only=set(), root=course) / "two.py"
    wrong.write_text(TWO.replace("return 2 * x", "return 0 if x == 2 else 2 * x"))
    hw.start("step91", tmp_path / "reference", only=set(), root=course)
    tasks = ["task91.twice", "task91.succ"]
    runs = [hw.plan("step91", tmp_path / d, timeout=30, tasks=tasks, root=course) for d in ("alone", "wrong")]
    runs.append(hw.plan("step91", tmp_path / "reference", timeout=30, tasks=tasks, root=course))
    runs[-1].trace = True
    alone, wrong_twice, reference = hw.execute(runs)

    twice, succ = alone["tasks"]
    assert (twice["points"], twice["passed"], twice["waiting"], twice["waits_for"]) == (1, 1, 1, ["task91.succ"])
    assert (succ["points"], succ["failed"], succ["waiting"]) == (0, 2, 0), "a task's own stub is no reason to wait"
    _print_report(alone, "step91")
    out = capsys.readouterr().out
    assert "-> 1 test of several tasks waits for task91.succ (unsolved)" in out
    assert "WAITING tests/step91/test_two.py::test_both [task91.succ, task91.twice]\n          for task91.succ" in out
    assert [(r["points"], r["failed"]) for r in wrong_twice["tasks"]] == [(0, 1), (0, 1)]
    assert {r["id"]: r["calls"] for r in reference["tasks"]} == {"task91.twice": [], "task91.succ": []}
    assert reference["traced"]["tests/step91/test_two.py::test_both"] == {
        "tasks": ["task91.succ", "task91.twice"], "ran": ["task91.succ", "task91.twice"]}


# ---------------------------------------------------------------- points and the Gradescope format


def _worth(course: Path, points: str) -> None:
    """Give task91.triangle `points` on its marker (e.g. ' points=3')."""
    mathy = course / "step91_fake" / "mathy.py"
    marker = "# BEGIN SOLUTION task91.triangle"
    mathy.write_text(mathy.read_text().replace(marker, marker + points))


@pytest.mark.parametrize("marker,points", [("task1.x", 1), ("task1.x points=3", 3), ("task1.x   points=12  ", 12)])
def test_points_are_read_from_the_marker(marker: str, points: int):
    [region] = hw.find_regions(f"def f():\n    # BEGIN SOLUTION {marker}\n    pass\n    # END SOLUTION\n")
    assert (region.task, region.points) == ("task1.x", points)


@pytest.mark.parametrize("marker,error", [
    ("task1.x points=0", r"x\.py:2: .*points=N"), ("task1.x points=two", r"x\.py:2: .*points=N"),
    ("task1.x pts=2", r"x\.py:2: .*points=N"), ("points=2", r"x\.py:2: .*task id"),
    ("task1.x points=2 points=3", r"x\.py:2: .*one option"),
])
def test_bad_points_are_clear_errors(marker: str, error: str):
    with pytest.raises(hw.MarkerError, match=error):
        hw.find_regions(f"def f():\n    # BEGIN SOLUTION {marker}\n    pass\n    # END SOLUTION\n", "x.py")


def test_markers_of_one_task_must_agree_on_points(course: Path, tmp_path: Path):
    source = ("def f():\n    # BEGIN SOLUTION t.a points=2\n    pass\n    # END SOLUTION\n\n\n"
              "def g():\n    # BEGIN SOLUTION t.a\n    pass\n    # END SOLUTION\n")
    with pytest.raises(hw.MarkerError, match=r"x\.py:8: t\.a is worth points=1 here but points=2 at x\.py:2"):
        hw.find_regions(source, "x.py")
    # across files of one chapter: the error names both places, and no copy is made
    (course / "step91_fake" / "more.py").write_text(
        "def h():\n    # BEGIN SOLUTION task91.add points=4\n    pass\n    # END SOLUTION\n")
    with pytest.raises(hw.MarkerError, match=r"more\.py:2: task91\.add is worth points=4 here but points=1 at "
                                             r".*mathy\.py:9"):
        hw.start("step91", tmp_path / "hw", root=course)
    assert not (tmp_path / "hw" / "step91_fake").exists()


def test_points_weigh_the_score_in_json_and_table(course: Path, tmp_path: Path, capsys):
    _worth(course, " points=3")
    hw.start("step91", tmp_path / "hw", only={"task91.triangle"}, root=course)
    argv = ["check", "step91", "--dest", str(tmp_path / "hw"), "--root", str(course)]
    assert hw.main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(t["id"], t["points"], t["max_points"]) for t in result["tasks"]] == [
        ("task91.add", 1, 1), ("task91.triangle", 0, 3)]
    assert (result["score"], result["max_score"]) == (1, 4)
    assert hw.main(argv) == 0
    out = capsys.readouterr().out
    assert "score: 1/4" in out and "0/3" in out


def test_gradescope_results_file(course: Path, tmp_path: Path, capsys):
    _worth(course, " points=3")
    hw.start("step91", tmp_path / "hw", only={"task91.add"}, root=course)
    results = tmp_path / "results" / "results.json"
    argv = ["check", "step91", "--dest", str(tmp_path / "hw"), "--root", str(course), "--format", "gradescope"]
    assert hw.main([*argv, "--output", str(results)]) == 0
    data = json.loads(results.read_text())
    assert data["score"] == 3 and isinstance(data["execution_time"], float | int)
    assert [(t["name"], t["score"], t["max_score"], t["visibility"]) for t in data["tests"]] == [
        ("task91.add", 0, 1, "visible"), ("task91.triangle", 3, 3, "visible")]
    add = data["tests"][0]["output"]
    assert "0/3 tests pass" in add and "NotImplementedError: task91.add" in add
    assert "3/4" in data["output"]
    capsys.readouterr()
    assert hw.main(argv) == 0  # without --output: the same object on stdout
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tests"] == data["tests"]


def test_gradescope_gets_a_results_file_even_when_the_check_cannot_run(course: Path, tmp_path: Path, capsys):
    results = tmp_path / "results.json"
    argv = ["check", "step91", "--dest", str(tmp_path / "none"), "--root", str(course), "--format", "gradescope",
            "--output", str(results)]
    assert hw.main(argv) == 2
    data = json.loads(results.read_text())
    assert data["score"] == 0 and [(t["name"], t["max_score"]) for t in data["tests"]] == [
        ("task91.add", 1), ("task91.triangle", 1)]
    assert "homework start step91" in data["output"]
