"""Every homework task is gradable: its tests pass on the reference and fail when only it is stubbed; and each
chapter's Exercises table says which other tasks a task's tests run (its *needs* column). In the chapters of
ALONE every task is checkable alone: a copy with only that task solved earns its points and no other task's, and
no task's tests run the body of another task of its chapter outside a test tagged with both (an end-to-end test,
which waits for the unsolved tasks it names: course/homework_tool/grading.py).

One worker process runs, for every chapter with markers, the reference and one copy per task with only
that task stubbed (tagged tests only), and for the chapters of ALONE one copy per task with only that task solved,
so torch is imported once. Each task is its own test item. The reference's run is traced
(course/homework_tool/trace.py): each test records the tasks whose bodies it ran. In a student release the bodies
are stubs already: there is no reference to prove against, so the proof skips there (and says so).
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

# The chapters whose every task is checked alone: each task's tests build their own inputs (stand-ins for the
# chapter's other bodies, references written in the test), so a copy with only that task solved earns its points.
ALONE = [
    "step01_kvcache", "step02_paged",
    "step03_prefix_hash",  # each body on the stand-ins of the chapter's others (tests/step03/stand_in.py)
    "step04_radix",  # its tree's tasks on the stand-in tree of tests/step04/stand_in.py
    "step05_bridge",  # the bridge's bodies on the stand-ins of tests/step05/stand_in.py
    "step06_triton",  # each building block of the kernels in a small kernel of its own (tests/step06/test_kernels.py)
    "step07_serving",  # CacheAware on a stand-in match (tests/step07/test_routing.py)
]
ALONE_TASKS = [(chapter, task) for chapter, task in TASKS if chapter in ALONE]


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
        for task in tasks if chapter in ALONE else []:  # only `task` solved: every tagged test of the chapter runs
            dest = base / f"{chapter}-{task}-alone"
            hw.start(chapter, dest, only=set(tasks) - {task})
            keys.append((chapter, task, "alone"))
            plans.append(hw.plan(chapter, dest, timeout=60, tasks=tasks))
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
    earlier ones) whose bodies the task's tests ran on the reference. In a chapter of ALONE, a test's own tags are
    no needs (it waits for them); elsewhere they are, until the chapter's tests are reshaped."""
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
    reference = runs[(chapter, None)]
    for row in reference["tasks"]:
        ran = set(row["calls"]) if chapter in ALONE else {
            t for test in reference["traced"].values() if row["id"] in test["tasks"] for t in test["ran"]} - {row["id"]}
        cell = cells.get(row["id"])
        if cell is None or needs.parse(cell, every) != ran:
            wrong.append(f"  {row['id']}: the table says {cell!r}; its tests run "
                         f"{needs.describe(ran, row['id'], every)!r}")
    assert not wrong, f"{chapter}/README.md's needs column:\n" + "\n".join(wrong)


@pytest.mark.parametrize("chapter,task", ALONE_TASKS, ids=[f"{c}:{t}" for c, t in ALONE_TASKS])
def test_a_task_solved_alone_earns_its_points_alone(chapter: str, task: str, runs: dict) -> None:
    """A copy of the chapter in which only `task` is solved (the others stubbed) earns exactly `task`'s points:
    its tests reach no other task's stub except in a test tagged with that task too, which waits for it."""
    if STUBBED[chapter]:
        pytest.skip(NO_REFERENCE)
    run = runs[(chapter, task, "alone")]
    assert run["error"] is None and not run["collect_errors"], run["error"] or run["collect_errors"]
    earned = {r["id"]: r["points"] for r in run["tasks"] if r["points"]}
    worth = hw.task_points(hw.find_tasks(chapter))[task]
    row = _row(run, task)
    stopped = [f"{f['nodeid']}: {f['message']}" for f in run["failures"] if task in f["tasks"]]
    assert earned == {task: worth}, (
        f"with only {task} solved the copy earns {earned}, not {{{task!r}: {worth}}}; {task}: {row['passed']} "
        f"passed, {row['failed'] + row['errors']} failed, {row['waiting']} waiting; failing:\n  "
        + "\n  ".join(stopped))


@pytest.mark.parametrize("chapter", ALONE)
def test_no_task_needs_another_of_its_chapter(chapter: str, runs: dict) -> None:
    """On the reference, every test runs the bodies of its chapter's tasks that it is tagged with, and no other: a
    task's tests reach another task of the chapter only in a test tagged with both. Earlier chapters may be run
    (the *needs* column says which)."""
    if STUBBED[chapter]:
        pytest.skip(NO_REFERENCE)
    own = set(hw.find_tasks(chapter))
    wrong = []
    for nodeid, test in runs[(chapter, None)]["traced"].items():
        ran, tags = set(test["ran"]) & own, set(test["tasks"]) & own
        if ran - tags:
            wrong.append(f"  {nodeid} [{', '.join(sorted(tags))}] runs {', '.join(sorted(ran - tags))}: tag it too, "
                         "or give it inputs that need no other task")
        if tags - ran:
            wrong.append(f"  {nodeid} is tagged with {', '.join(sorted(tags - ran))}, whose body it never runs")
    assert not wrong, f"tests/{chapter.split('_')[0]}/:\n" + "\n".join(wrong)



def test_every_chapter_with_tasks_is_checked_alone():
    """A new chapter's homework joins ALONE: its tasks' tests build their own inputs before it ships."""
    missing = {chapter for chapter, _ in TASKS} - set(ALONE)
    assert not missing, f"tasks not checked alone in {sorted(missing)}: give their tests their own inputs"
