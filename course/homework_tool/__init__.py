"""Homework: student copies of a chapter with the marked bodies stubbed out, per-task grading, and the student
edition of the whole course. One module per job:

- markers.py: BEGIN/END SOLUTION markers in a file, and the stub that replaces a marked body;
- tasks.py: a chapter's tasks, and `start`, its student copy with them stubbed;
- runner.py: the worker processes that run a chapter's tests against a copy (pytest, a timeout per test), and
  the grader's side of them: a signed report channel, canary tests, a wall-clock limit enforced from outside;
- integrity.py: what the grader trusts: the release's manifest, a private copy of the tests, the points read
  before any student code runs, and what changed during a run (tampering);
- procs.py: every process a check started, found through /proc and killed (sessions, a child subreaper);
- grading.py: `check`, the score of each task from what ran;
- gradescope.py: that score as Gradescope's results.json;
- release.py: the student edition (`release`): stubs, and no instructor files, sections or reference outputs;
- leaks.py: the search for solutions that leak into a release, as text or renamed (syntax trees compared);
- cli.py: `python -m course homework start|check|release`.
"""
from .cli import main
from .grading import RULE, check, execute, plan
from .markers import MarkerError, Region, find_regions, is_stub, make_stub, signatures
from .tasks import DEFAULT_DEST, CheckError, find_tasks, resolve_chapter, start, stubbed_tasks, task_points

__all__ = ["DEFAULT_DEST", "RULE", "CheckError", "MarkerError", "Region", "check", "execute", "find_regions",
           "find_tasks", "is_stub", "main", "make_stub", "plan", "resolve_chapter", "signatures", "start",
           "stubbed_tasks", "task_points"]
