"""Gradescope's autograder format: a check's result as its results.json, one test per task
(https://gradescope-autograders.readthedocs.io/en/latest/specs/)."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from .grading import failed_bodies, unsolved_needs


def gradescope(result: dict) -> dict:
    """The check's result as Gradescope's autograder results.json: one test per task, worth its points. A test of
    several tasks that stops in the stub of another of them is listed under each task it waits for as waiting, not
    gradable yet (neutral, as the score counts it), never as a failure."""
    failing: dict[str, list[str]] = {}
    waiting: dict[str, list[str]] = {}
    for f in result["failures"]:
        for task in f["tasks"]:
            if others := [t for t in f.get("waits_for", []) if t != task]:
                waiting.setdefault(task, []).append(
                    f"WAITING {f['nodeid']}\n    not gradable yet: it stops in the stub of {', '.join(others)} "
                    "(unsolved), another task it runs; it counts once that is written, and costs no points meanwhile")
            else:
                failing.setdefault(task, []).append(f"{f['outcome'].upper()} {f['nodeid']}\n    {f['message']}")
    problems = [result["error"]] if result["error"] else []
    problems += [f"could not collect {c['nodeid']}: {c['message']} (every task scores 0 until it imports)"
                 for c in result["collect_errors"]]
    tests = []
    for r in result["tasks"]:
        lines = [f"{r['passed']}/{r['total']} tests pass" + "".join(
            f", {r[k]} {k}" for k in ("failed", "errors", "skipped", "waiting") if r.get(k))]
        if needs := unsolved_needs(r):  # a task that earned its points has nothing to solve first
            lines.append(needs if r["points"] else f"{needs}: solve it first")
        lines += [bodies] if (bodies := failed_bodies(r)) else []
        lines += failing.get(r["id"], [])[:10] + waiting.get(r["id"], [])[:10] + problems
        tests.append({"name": r["id"], "score": r["points"], "max_score": r["max_points"],
                      "status": "passed" if r["points"] == r["max_points"] else "failed",
                      "output": "\n".join(lines), "visibility": "visible"})
    summary = [f"{result['chapter']}: {result['score']}/{result['max_score']} points", *result.get("notes", []),
               *problems]
    return {"score": result["score"], "execution_time": result["seconds"] or 0, "output": "\n".join(summary),
            "visibility": "visible", "stdout_visibility": "visible", "tests": tests}


def write_json(output: Path, obj: dict) -> None:
    """`obj` as one line of JSON in the file `output`, written whole or not at all (a temporary file renamed over
    it), readable as a file the user made."""
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(obj) + "\n")
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, output)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
