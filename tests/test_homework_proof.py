"""Every homework task is gradable: its tests pass on the reference and fail when only it is stubbed; and each
chapter's Exercises table says which other tasks a task's tests run (its *needs* column).

One worker process runs, for every chapter with markers, the reference and one copy per task with only
that task stubbed (tagged tests only), so torch is imported once. Each task is its own test item. The
reference's run is traced (course/homework_tool/trace.py): each test records the tasks whose bodies it ran.
In a student release the bodies are stubs already: there is no reference to prove against, so the
proof skips there (and says so).
"""
from __future__ import annotations

import os
import re

import pytest

from course import homework_tool as hw
from course.chapters import chapters
from course.homework_tool import needs, trace
from course.paths import REPO_ROOT

CHAPTERS = chapters()
TASKS = [(chapter, task) for chapter in CHAPTERS for task in hw.find_tasks(chapter)]
STUBBED = {chapter: hw.stubbed_tasks(chapter) for chapter in CHAPTERS}
NO_REFERENCE = "a student release: the bodies are stubs here, so there is no reference to prove against"


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, dict]:
    """(chapter, None) -> the reference's run of all tagged tests; (chapter, task) -> the run of that task's
    tests with only that task stubbed. Only chapters with a selected test item are run (`-k step01`)."""
    selected = {item.callspec.params["chapter"] for item in request.session.items
                if getattr(item, "module", None) is request.module and hasattr(item, "callspec")}
    base = tmp_path_factory.mktemp("proof")
    keys, plans = [], []
    for chapter in sorted(selected):
        tasks = list(hw.find_tasks(chapter))
        if not tasks or STUBBED[chapter] or not hw.resolve_chapter(chapter)[1].is_dir():
            continue  # no tasks: nothing to prove; a release: no reference; no tests: every task fails below
        for task in [None, *tasks]:
            dest = base / f"{chapter}-{task or 'reference'}"
            hw.start(chapter, dest, only=set() if task is None else {task})
            keys.append((chapter, task))
            plans.append(hw.plan(chapter, dest, timeout=60, tasks=tasks if task is None else [task]))
            plans[-1].trace = task is None  # the reference's run says which tasks' bodies each test ran
    workers = max(1, min(2, os.cpu_count() or 1))
    with pytest.MonkeyPatch.context() as env:
        # a stubbed task fails its first Hypothesis example; shrinking it changes no verdict (tests/conftest.py)
        env.setenv("KVCOURSE_HYPOTHESIS_PROFILE", "no-shrink")
        return dict(zip(keys, hw.execute(plans, total_timeout=600, workers=workers), strict=True))


def _row(result: dict, task: str) -> dict:
    return next(r for r in result["tasks"] if r["id"] == task)


@pytest.mark.parametrize("chapter,task", TASKS, ids=[f"{c}:{t}" for c, t in TASKS])
def test_task_is_gradable(chapter: str, task: str, runs: dict) -> None:
    prefix = chapter.split("_")[0]
    if STUBBED[chapter]:
        pytest.skip(NO_REFERENCE)
    if (chapter, None) not in runs:
        pytest.fail(f"{task} has no tests: tests/{prefix}/ does not exist")
    reference = runs[(chapter, None)]
    assert reference["error"] is None and not reference["collect_errors"], (
        f"the reference of {chapter} did not run cleanly: {reference['error'] or reference['collect_errors']}")
    ref = _row(reference, task)
    assert ref["total"] >= 1, f"{task} has no test tagged @pytest.mark.task({task!r}) in tests/{prefix}/"
    broken = [f for f in reference["failures"] if task in f["tasks"]]
    assert ref["failed"] == ref["errors"] == 0, f"the reference fails tests of {task}: {broken}"
    if ref["passed"] == 0:
        pytest.skip(f"every test of {task} is skipped here")
    worth = hw.task_points(hw.find_tasks(chapter))[task]
    assert ref["max_points"] == ref["points"] == worth >= 1, f"the reference earns {ref['points']}/{worth} on {task}"

    for path in sorted((REPO_ROOT / chapter).rglob("*.py")):
        source = path.read_text()
        stub = hw.make_stub(source, only={task}, chapter=chapter, filename=str(path))
        assert hw.signatures(stub) == hw.signatures(source), f"stubbing {task} changed a signature in {path.name}"

    run = runs[(chapter, task)]
    stubbed = _row(run, task)
    assert stubbed["total"] == ref["total"], (
        f"with {task} stubbed, {stubbed['total']} of its {ref['total']} tests ran: "
        f"{run['error'] or run['collect_errors']}")
    assert stubbed["failed"] + stubbed["errors"] >= 1, (
        f"every test of {task} passes with {task} stubbed out: its tests do not test it")
    assert (stubbed["points"], stubbed["max_points"]) == (0, worth)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_tags_name_real_tasks(chapter: str, runs: dict) -> None:
    if STUBBED[chapter]:
        pytest.skip(NO_REFERENCE)
    if (chapter, None) not in runs:
        pytest.skip(f"{chapter} has no homework markers or no tests folder")
    unknown = runs[(chapter, None)]["unknown_tasks"]
    assert not unknown, f"tests/{chapter.split('_')[0]}/ tags tasks that no marker defines: {unknown}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_exercises_say_what_each_task_needs(chapter: str, runs: dict) -> None:
    """The *needs* column of the chapter's Exercises table names exactly the other tasks (of this chapter and of
    earlier ones) whose bodies the task's tests ran on the reference."""
    if STUBBED[chapter]:
        pytest.skip(NO_REFERENCE)
    if (chapter, None) not in runs:
        pytest.skip(f"{chapter} has no homework markers or no tests folder")
    regions = [r for found in hw.find_tasks(chapter).values() for r in found]
    if not trace.interpreted() and any(r.function.split(".")[-1] in trace.kernels((REPO_ROOT / r.file).read_text())
                                       for r in regions):
        pytest.skip("Triton compiles the kernels' bodies on a GPU, and a compiled body records nothing")
    every = {int(c.removeprefix("step")[:2]): list(hw.find_tasks(c)) for c in CHAPTERS}
    readme = (REPO_ROOT / chapter / "README.md").read_text()
    cells = dict(re.findall(r"^\| `(task\d+\.[\w\-]+)` \| \d+ \| ([^|]*) \|", readme, re.M))
    wrong = []
    for row in runs[(chapter, None)]["tasks"]:
        ran = set(row["calls"])
        cell = cells.get(row["id"])
        if cell is None or needs.parse(cell, every) != ran:
            wrong.append(f"  {row['id']}: the table says {cell!r}; its tests run "
                         f"{needs.describe(ran, row['id'], every)!r}")
    assert not wrong, f"{chapter}/README.md's needs column:\n" + "\n".join(wrong)
