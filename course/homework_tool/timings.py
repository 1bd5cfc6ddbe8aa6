"""`python -m course homework timings`: how long `homework check` takes on each chapter, for the instructors' guide.

For every chapter with tasks, the reference is copied as `homework start` copies it, with nothing stubbed, into a
temporary homework folder, and `python -m course homework check stepNN --json` runs on it twice, as a student runs
it: every test, then `--scored-only` (the tagged tests alone, what the Gradescope autograder runs). What is timed is
the whole command, from its start to its exit: Python's start, torch's import, the test process and the grader.
A run that does not score full points on the reference stops the measurement (the numbers would not be the
check's). The result, with the machine (CPU, cores, load, Python, torch), goes to `instructors/check_times.json`;
`python -m course report --write` renders it into `instructors/README.md` (benchmarks/check_times.py).
Run it on a quiet machine: the chapters are checked one after the other, each alone.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.check_times import COMMAND, data_path
from course import results

from ..paths import REPO_ROOT, shown
from .autograder import head_commit
from .tasks import CheckError, find_tasks, select_chapters, start, stubbed_tasks, task_points

TIMEOUT = 60.0  # check's default seconds per test: what a student gets


def time_check(chapter: str, dest: Path, scored_only: bool, root: Path) -> dict:
    """One `homework check` of the copy in `dest`, as a command: its wall-clock seconds and what it reported."""
    cmd = [sys.executable, "-m", "course", "homework", "check", chapter, "--dest", str(dest), "--json",
           *(["--scored-only"] if scored_only else []), *(["--root", str(root)] if root != REPO_ROOT.resolve() else [])]
    began = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    wall = time.perf_counter() - began
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise CheckError(f"`{' '.join(cmd[1:])}` failed (exit code {done.returncode}):\n{done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if result["score"] != result["max_score"] or result["error"]:
        raise CheckError(f"{chapter}'s reference scored {result['score']}/{result['max_score']}"
                         + (f": {result['error']}" if result["error"] else "") + "; fix that before timing it")
    counts = [*result["tasks"], result["untagged"]]
    return {"wall_s": round(wall, 1), "tests_s": result["seconds"],
            "tests": sum(r["total"] for r in counts), "passed": sum(r["passed"] for r in counts),
            "skipped": sum(r["skipped"] for r in counts), "failed": sum(r["failed"] + r["errors"] for r in counts)}


def measure(chapters: list[str] | None = None, root: Path | None = None, log: Callable[[str], object] = print) -> dict:
    """Time `check` and `check --scored-only` on the reference of each chapter (default: every one with tasks)."""
    root = (root or REPO_ROOT).resolve()
    packages = [p for p in select_chapters(chapters, root) if find_tasks(p, root)]
    if stubbed := [p for p in packages if stubbed_tasks(p, root)]:
        raise CheckError(f"{', '.join(stubbed)} hold stubs here (a student edition?): there is no reference to time")
    record = {**results.started(COMMAND + (" " + " ".join(chapters) if chapters else "")),
              "commit": head_commit(root) or "unknown", "timeout": TIMEOUT, "chapters": {}}
    for package in packages:
        points = task_points(find_tasks(package, root))
        with tempfile.TemporaryDirectory(prefix="kvcourse-timings-") as tmp:
            start(package, tmp, only=set(), root=root)
            short = package.split("_")[0]
            full = time_check(short, Path(tmp), False, root)
            scored = time_check(short, Path(tmp), True, root)
        record["chapters"][package] = {"tasks": len(points), "points": sum(points.values()), "tests": full["tests"],
                                       "check": full, "scored_only": scored}
        log(f"{package}: check {full['wall_s']:.1f} s ({full['tests']} tests), --scored-only "
            f"{scored['wall_s']:.1f} s ({scored['tests']} tests)")
    record["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    return record


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("timings", help="time `check` on the reference of every chapter, for the instructors' guide",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("chapters", nargs="*", metavar="CHAPTER", help="default: every chapter with tasks")
    p.add_argument("--output", type=Path, metavar="FILE",
                   help=f"default: {shown(data_path())}, which `python -m course report --write` renders")
    p.add_argument("--root", type=Path, help=argparse.SUPPRESS)  # another course checkout (for tests)


def main(args: argparse.Namespace) -> int:
    try:
        record = measure(args.chapters or None, args.root)
    except CheckError as exc:
        print(f"homework timings: {exc}", file=sys.stderr)
        return 2
    output = args.output or data_path(args.root)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {shown(output)}; now run: python -m course report --write")
    return 0
