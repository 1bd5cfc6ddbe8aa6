"""Grading a student copy: plan the run of its chapter's tests, run it, and score each task from what ran.

Scoring rule: a task earns its points (`points=N` on its markers, default 1) when it has at least one test,
none of its tests fails or errors, and at least one passes (skips are neutral; a skip raised from the student's
code is a failure). An end-to-end test is tagged with every task whose body it runs: while it stops in the stub of
one of them (a body the copy still leaves as `raise NotImplementedError`), it waits, neutral, for the others it
names; it counts for all of them once none of their stubs is in its way. So a task whose own tests pass earns
its points before the tasks it is tested together with are written.

Untagged tests are reported but do not score. A test module that cannot even be collected
zeroes every task, since its tests cannot be attributed; tampering (see runner.py and integrity.py) zeroes the
whole check. The points come from the markers as `plan` reads them, before any student code runs. In a student
release (course/homework_tool/release.py) there is no reference: the earlier chapters a chapter builds on are
stubbed too, so they come from the student's own copies when there are any.
"""
from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ..paths import REPO_ROOT, shown
from .integrity import Snapshot, read_manifest
from .markers import MarkerError, Region, is_stub
from .runner import Ended, Job, Run, run_workers
from .tasks import DEFAULT_DEST, CheckError, earlier_chapters, find_tasks, resolve_chapter, task_points

RULE = ("a task earns its points (1 unless its marker says points=N) when all of its tests pass "
        "(at least one must pass; skips are neutral, and so is a test of several tasks while it stops in the "
        "stub of another of them)")


def plan(chapter: str, dest: Path | str = DEFAULT_DEST, timeout: float = 60.0, extra_tests: Path | str | None = None,
         tasks: Iterable[str] | None = None, root: Path | None = None, tests_dir: Path | str | None = None) -> Run:
    """The Run that checks the copy `dest/<package>` of `chapter` against its tests."""
    root = (root or REPO_ROOT).resolve()
    package, default_tests = resolve_chapter(chapter, root)
    dest = Path(dest).resolve()
    if not (dest / package / "__init__.py").is_file():
        raise CheckError(f"no student copy at {shown(dest / package)}; "
                         f"run: python -m course homework start {chapter}")
    if tasks is not None and (unknown := set(tasks) - set(find_tasks(package, root))):
        raise CheckError(f"unknown task(s) {', '.join(sorted(unknown))}; {package} has: "
                         f"{', '.join(find_tasks(package, root))}")
    tests = [Path(tests_dir or default_tests).resolve()] + ([Path(extra_tests).resolve()] if extra_tests else [])
    for path in tests:
        if not path.exists():
            raise CheckError(f"no tests at {shown(path)}")
    earlier = earlier_chapters(package, dest, root)
    return Run(package, str(dest), [str(p) for p in tests], str(root), float(timeout),
               list(tasks) if tasks is not None else None, built_on=[e.package for e in earlier if e.from_copy],
               notes=[note for e in earlier if (note := e.note())], points=task_points(find_tasks(package, root)))


def execute(runs: list[Run], total_timeout: float = 1800.0, workers: int = 1, verbose: bool = False) -> list[dict]:
    """Run `runs` in `workers` worker processes (each imports torch once) and grade each run.

    Before any worker starts, each run's tests, config and points are read (and, in a release, checked against
    its manifest); the workers run a private copy of them. Afterwards, a change to that copy or to the course's
    own files is tampering (undone in a release), and so is whatever the workers' channel showed."""
    snapshots = [Snapshot.take(run.package, Path(run.rootdir), run.tests, run.points or
                               task_points(find_tasks(run.package, Path(run.rootdir)))) for run in runs]
    for run, snap in zip(runs, snapshots, strict=True):
        run.points = snap.points
    ended = [Ended(tampering=list(snap.tampering)) for snap in snapshots]
    with tempfile.TemporaryDirectory(prefix="kvcourse-check-") as tmp:
        jobs, which = [], []
        for i, (run, snap) in enumerate(zip(runs, snapshots, strict=True)):
            if snap.tampering:
                continue  # nothing to run: the tests are not the instructor's
            task = (run.tasks or list(run.points) or [None])[0]
            snap.private(Path(tmp) / f"run{i}", task)
            jobs.append(Job(run, str(snap.copy), [str(snap.copy / t) for t in snap.tests],
                            str(snap.copy / "pyproject.toml"), snap.canaries, snap.secret, snap.expected))
            which.append(i)
        try:
            for i, result in zip(which, run_workers(jobs, Path(tmp), total_timeout, workers, verbose), strict=True):
                ended[i] = result
        finally:
            for i in which:
                if changed := snapshots[i].private_changes():
                    ended[i].tampering.append(f"the grader's private copy of the tests changed during the run: "
                                              f"{', '.join(changed[:5])}")
    for snap, e in zip(snapshots, ended, strict=True):
        if changed := snap.course_changes():
            e.tampering.append("the course's files changed during the run: " + "; ".join(changed)
                               + (" (restored)" if snap.release else ""))
        e.notes[:0] = snap.notes
    return [_summarize(run, e) for run, e in zip(runs, ended, strict=True)]


def check(chapter: str, dest: Path | str = DEFAULT_DEST, timeout: float = 60.0, extra_tests: Path | str | None = None,
          tasks: Iterable[str] | None = None, root: Path | None = None, tests_dir: Path | str | None = None,
          total_timeout: float = 1800.0, verbose: bool = False) -> dict:
    """Grade the copy `dest/<package>`: the JSON-able result that `check --json` prints."""
    run = plan(chapter, dest, timeout, extra_tests, tasks, root, tests_dir)
    return execute([run], total_timeout, verbose=verbose)[0]


def _counts() -> dict[str, int]:
    return {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "total": 0}


def _summarize(run: Run, ended: Ended) -> dict:
    """Per-task counts and points from what the grader verified of the run."""
    if ended.fatal:
        raise CheckError(ended.fatal)
    worth = run.points
    marked = set(worth)
    if ended.exit_code in (2, 3, 4) and not ended.tests and not ended.error and not ended.tampering:
        raise CheckError(f"pytest could not run (exit code {ended.exit_code}); its output ended with:\n{ended.output}")
    tasks = {t: {**_counts(), "waiting": 0} for t in (list(worth) if run.tasks is None else run.tasks)}
    untagged, failures = _counts(), []
    field = {"passed": "passed", "failed": "failed", "error": "errors", "skipped": "skipped"}
    regions = _copy_regions(Path(run.dest), run.package)
    waits: dict[str, set[str]] = {t: set() for t in tasks}  # task -> the tasks whose stubs its tests wait for
    waiting: dict[str, set[str]] = {t: set() for t in tasks}  # task -> its tests that wait
    for nodeid, names in ended.tests.items():
        outcome, message, timed_out = ended.results[nodeid]
        stubs = _stopped_in(names, ended.frames.get(nodeid, []), regions) if outcome in ("failed", "error") else set()
        buckets = [n for n in names if n in tasks] or ([] if marked & set(names) else [None])
        for name in buckets:
            bucket = untagged if name is None else tasks[name]
            if name is not None and stubs - {name}:  # it stopped in the stub of another task it is tagged with
                bucket["waiting"] += 1
                waits[name] |= stubs - {name}
                waiting[name].add(nodeid)
            else:
                bucket[field[outcome]] += 1
            bucket["total"] += 1
        if outcome in ("failed", "error"):
            failures.append({"nodeid": nodeid, "tasks": names, "outcome": "timeout" if timed_out else outcome,
                             "message": message, **({"waits_for": sorted(stubs)} if set(names) - stubs else {})})
    bodies = _bodies(Path(run.dest), regions, failures, ended.frames)
    rows = []
    for task, c in tasks.items():
        clean = not ended.collect_errors and not ended.tampering
        earned = clean and c["passed"] > 0 and c["failed"] == c["errors"] == 0
        stopped = [f for f in failures if f["nodeid"] not in waiting[task]]
        rows.append({"id": task, **c, "points": worth[task] if earned else 0, "max_points": worth[task],
                     "bodies": bodies.get(task, []), "needs": [] if earned else _needs(task, stopped),
                     "waits_for": sorted(waits[task])})
        if run.trace:  # the other tasks whose bodies this task's tests ran, untagged there (the proof's reference)
            rows[-1]["calls"] = sorted({t for nodeid, names in ended.tests.items() if task in names
                                        for t in set(ended.ran.get(nodeid, [])) - set(names)})
    error = ended.error
    if ended.tampering:
        error = "tampering: " + "; ".join(ended.tampering) + ". Every task scores 0." + (f"\n{error}" if error else "")
    return {"chapter": run.package, "copy": str(Path(run.dest) / run.package), "tasks": rows,
            "score": sum(r["points"] for r in rows), "max_score": sum(r["max_points"] for r in rows),
            "untagged": untagged, "unknown_tasks": sorted(set(ended.tags) - marked), "failures": failures,
            "collect_errors": ended.collect_errors, "error": error, "seconds": ended.seconds,
            "notes": [*run.notes, *ended.notes], "rule": RULE, "tampering": ended.tampering,
            **({"traced": {nodeid: {"tasks": names, "ran": sorted(ended.ran.get(nodeid, []))}
                           for nodeid, names in ended.tests.items()}} if run.trace else {})}


def _copy_regions(dest: Path, package: str) -> dict[str, list[tuple[Region, bool]]]:
    """Task -> its marked bodies in the student's copy, each with whether it is still the stub. A copy whose
    markers cannot be read has none."""
    try:
        regions = find_tasks(package, dest)
    except (CheckError, MarkerError, SyntaxError, OSError):
        return {}
    texts: dict[Path, str] = {}
    return {task: [(r, is_stub(texts.setdefault(r.file, (dest / r.file).read_text()), r)) for r in found]
            for task, found in regions.items()}


def _inside(r: Region, frames: list) -> bool:
    return any(file == r.file.as_posix() and r.begin < line < r.end for file, line in frames)


def _stopped_in(names: list[str], frames: list, regions: dict[str, list[tuple[Region, bool]]]) -> set[str]:
    """The tasks among `names` (a failing test's tags) whose stub, still in the copy, the test raised through."""
    return {task for task in names for r, stub in regions.get(task, []) if stub and _inside(r, frames)}


def _bodies(dest: Path, regions: dict[str, list[tuple[Region, bool]]], failures: list[dict],
            frames: dict[str, list[list]]) -> dict[str, list[dict]]:
    """Task -> its bodies in the student's copy, as the copy's markers show them: `function`, `file`, `line` (of
    the BEGIN marker), `stub` (still `raise NotImplementedError`) and `failing_tests` (how many of the task's
    failing tests raised inside that body)."""
    out: dict[str, list[dict]] = {}
    for task, found in regions.items():
        failing = [frames.get(f["nodeid"], []) for f in failures if task in f["tasks"]]
        for r, stub in found:
            inside = sum(_inside(r, test) for test in failing)
            out.setdefault(task, []).append({"function": r.function, "file": r.file.as_posix(), "line": r.begin,
                                             "stub": stub, "failing_tests": inside})
    return out


_STUB_RAISED = re.compile(r"\bNotImplementedError: (task[\w.\-]+): ")


def _needs(task: str, failures: list[dict]) -> list[str]:
    """The other tasks whose stubs the failing tests of `task` raised in (`raise NotImplementedError("taskN.x:
    ...")`, in this chapter's copy, an earlier chapter's copy or a release's stubbed chapter): solve those first."""
    return sorted({m[1] for f in failures if task in f["tasks"]
                   and (m := _STUB_RAISED.search(f["message"])) and m[1] != task})


def unsolved_needs(row: dict) -> str | None:
    """For a task that failed because its tests ran into another task's stub: which ones; for one whose tests of
    several tasks wait for another's stub: that (None: neither)."""
    waiting, n = None, row.get("waiting", 0)
    if n and row.get("waits_for"):
        waiting = (f"{n} test{'s' if n > 1 else ''} of several tasks wait{'' if n > 1 else 's'} for "
                   + ", ".join(f"{t} (unsolved)" for t in row["waits_for"]))
    if row["points"] or not row.get("needs"):
        return waiting
    return "needs " + ", ".join(f"{t} (unsolved)" for t in row["needs"]) + (f"; {waiting}" if waiting else "")


def failed_bodies(row: dict) -> str | None:
    """For a task of several bodies that failed: which bodies are still stubs or, when none is, which ones its
    failing tests raised in (None when there is nothing to add: one body, the task passed, or no clue)."""
    bodies = row.get("bodies", [])
    if len(bodies) < 2 or row["points"] or not (row["failed"] or row["errors"]):
        return None
    if stubs := [b for b in bodies if b["stub"]]:
        written = [b["function"] for b in bodies if not b["stub"]]
        return (f"still {'a stub' if len(stubs) == 1 else 'stubs'}: {', '.join(map(_where, stubs))}"
                + (f"; written: {', '.join(written)}" if written else ""))
    if raised := [b for b in bodies if b["failing_tests"]]:
        return "failing tests raised in: " + ", ".join(
            f"{_where(b)}, {b['failing_tests']} test{'s' if b['failing_tests'] > 1 else ''}" for b in raised)
    return None


def _where(body: dict) -> str:
    return f"{body['function']} ({body['file']}:{body['line']})"


def unrunnable(chapter: str, message: str, root: Path | None) -> dict:
    """A zero result for a check that could not run (Gradescope still needs a results file)."""
    try:
        package, _ = resolve_chapter(chapter, root)
        shipped = (read_manifest((root or REPO_ROOT).resolve()) or {}).get("tasks", {}).get(package)
        worth = shipped if shipped is not None else task_points(find_tasks(package, root))
    except (CheckError, MarkerError):
        package, worth = chapter, {}
    rows = [{"id": t, **_counts(), "points": 0, "max_points": p, "bodies": [], "needs": []} for t, p in worth.items()]
    return {"chapter": package, "copy": "", "tasks": rows, "score": 0, "max_score": sum(worth.values()),
            "untagged": _counts(), "unknown_tasks": [], "failures": [], "collect_errors": [], "error": message,
            "seconds": None, "notes": [], "rule": RULE, "tampering": []}
