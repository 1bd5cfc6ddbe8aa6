"""The chapters, discovered: every `stepNN_x` package at the top of the course is one, so a new chapter needs no
registration. What a chapter adds to the course's commands (its bench, its report) lives in a module of its own
that registers itself when `import_each` loads it: `course/` never imports a chapter by name."""
from __future__ import annotations

import importlib
from pathlib import Path

from .paths import REPO_ROOT


def chapters(root: Path | None = None) -> list[str]:
    """The chapter packages of a course, in order."""
    root = root or REPO_ROOT
    return sorted(p.name for p in root.glob("step[0-9][0-9]_*") if (p / "__init__.py").is_file())


def import_each(module: str) -> None:
    """Import every chapter's `<module>` (e.g. `bench`, `report`): `benchmarks.stepNN.<module>`, where the chapter's
    measurement lives, or `stepNN_x.<module>` for a chapter that keeps its own."""
    for chapter in chapters():
        short = chapter.split("_")[0]
        if (REPO_ROOT / "benchmarks" / short / f"{module}.py").is_file():
            importlib.import_module(f"benchmarks.{short}.{module}")
        elif (REPO_ROOT / chapter / f"{module}.py").is_file():
            importlib.import_module(f"{chapter}.{module}")
