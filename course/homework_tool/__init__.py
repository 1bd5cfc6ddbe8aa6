"""Homework: student copies of a chapter with the marked bodies stubbed out, per-task grading, and the student
edition of the whole course. One module per job:

- markers.py: BEGIN/END SOLUTION markers in a file, and the stub that replaces a marked body;
- tasks.py: a chapter's tasks, and `start`, its student copy with them stubbed;
- runner.py: the worker processes that run a chapter's tests against a copy (pytest, a timeout per test), and
  the grader's side of them: a signed report channel, canary tests, a wall-clock limit enforced from outside;
- integrity.py: what the grader trusts: the release's manifest, a private copy of the tests, the points read
  before any student code runs, and what changed during a run (tampering);
- procs.py: every process a check started, found through /proc and killed (sessions, a child subreaper);
- grading.py: `check`, the score of each task from what ran, and the other tasks whose stubs its tests ran into;
- trace.py: which tasks' bodies each test runs (the reference instrumented at import time, for the proof);
- needs.py: the *needs* column of the Exercises tables, written from what the tests run and read back;
- gradescope.py: that score as Gradescope's results.json;
- autograder.py: a Gradescope autograder for one chapter (`autograder`: the zip, its setup.sh and run_autograder,
  with no solution of the chapters it stubs), and what it runs per submission (`run-autograder`: the student's
  files found in the upload, graded by `check`);
- written.py: the written part: the thought questions' points (from the READMEs), the students' answer sheet
  (`written`, and `start` beside the code) and the instructors' rubrics (instructors/rubrics/);
- release.py: the student edition (`release`): stubs, and no instructor files, sections or reference outputs;
- leaks.py: the search for solutions that leak into a release, as text, renamed (syntax trees compared) or as
  a formula written out in the lessons' markdown;
- overlay.py: `run` and `notebook`, a chapter's demo (or any command) and its notebook on the student's copy, the
  earlier chapters from the reference or the student's copies (overlay_site/sitecustomize.py, on PYTHONPATH);
- timings.py: `timings`, how long `check` takes on each chapter's reference, for the instructors' guide;
- cli.py: `python -m course homework start|check|run|notebook|release|autograder|run-autograder|timings`.
"""
from .cli import main
from .grading import RULE, check, execute, plan
from .markers import MarkerError, Region, find_regions, is_stub, make_stub, signatures
from .tasks import (
    DEFAULT_DEST,
    CheckError,
    find_tasks,
    resolve_chapter,
    start,
    stubbed_tasks,
    submission_files,
    task_points,
)

__all__ = ["DEFAULT_DEST", "RULE", "CheckError", "MarkerError", "Region", "check", "execute", "find_regions",
    "find_tasks", "is_stub", "main", "make_stub", "plan", "resolve_chapter", "signatures", "start",
    "stubbed_tasks", "submission_files", "task_points"]
