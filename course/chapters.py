"""The chapters, as the folders say: every `stepNN_x` package at the top of the course is one. The command line names
each chapter's modules where it runs them (course/bench.py, report.py, figures.py), and the tests check those lists
against this one."""
from __future__ import annotations

from pathlib import Path

from .paths import REPO_ROOT


def chapters(root: Path | None = None) -> list[str]:
    """The chapter packages of a course, in order."""
    root = root or REPO_ROOT
    return sorted(p.name for p in root.glob("step[0-9][0-9]_*") if (p / "__init__.py").is_file())
