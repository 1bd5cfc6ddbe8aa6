"""A chapter's homework tasks, found from its markers, and the student copy with their bodies stubbed."""
from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..chapters import chapters
from ..paths import REPO_ROOT, shown
from .markers import Region, check_points, find_regions, is_stub, make_stub

DEFAULT_DEST = REPO_ROOT / "homework"


class CheckError(RuntimeError):
    """The check could not run at all (as opposed to running and scoring low)."""


def resolve_chapter(chapter: str, root: Path | None = None) -> tuple[str, Path]:
    """'step01' or 'step01_kvcache' -> (package name, its tests folder tests/step01)."""
    root = root or REPO_ROOT
    name = chapter.strip().rstrip("/\\")
    packages = chapters(root)
    matches = [p for p in packages if p == name or p.split("_")[0] == name]
    if len(matches) != 1:
        raise CheckError(f"unknown chapter {chapter!r}; chapters: {', '.join(packages) or 'none'}")
    return matches[0], root / "tests" / matches[0].split("_")[0]


def select_chapters(names: Iterable[str] | None, root: Path | None = None) -> list[str]:
    """The packages of the chapters `names` ('step01' or 'step01_kvcache'), in order; None means all of them."""
    if names is None:
        return chapters(root or REPO_ROOT)
    return sorted({resolve_chapter(c, root)[0] for c in names})


def _sources(package_dir: Path) -> Iterator[Path]:
    yield from sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)


def find_tasks(chapter: str, root: Path | None = None) -> dict[str, list[Region]]:
    """Task id -> its marked regions in the reference package, in file order."""
    root = root or REPO_ROOT
    package, _ = resolve_chapter(chapter, root)
    tasks: dict[str, list[Region]] = {}
    for path in _sources(root / package):
        for region in find_regions(path.read_text(), str(path.relative_to(root))):
            tasks.setdefault(region.task, []).append(region)
    check_points(r for regions in tasks.values() for r in regions)
    return tasks


def task_points(tasks: dict[str, list[Region]]) -> dict[str, int]:
    """Task id -> what it is worth."""
    return {task: regions[0].points for task, regions in tasks.items()}


def stubbed_tasks(chapter: str, root: Path | None = None) -> set[str]:
    """Tasks of `chapter` whose body in `root` is a stub: in a student release there is no reference for them."""
    root = root or REPO_ROOT
    out = set()
    for task, regions in find_tasks(chapter, root).items():
        for r in regions:
            if is_stub((root / r.file).read_text(), r):
                out.add(task)
    return out


def start(chapter: str, dest: Path | str = DEFAULT_DEST, force: bool = False, only: set[str] | None = None,
          root: Path | None = None) -> Path:
    """Copy the chapter to `dest/<package>` with the marked bodies stubbed; returns the copy's folder."""
    root = root or REPO_ROOT
    package, _ = resolve_chapter(chapter, root)
    source_dir, target = root / package, Path(dest).resolve() / package
    if target == source_dir.resolve():
        raise CheckError(f"--dest {dest} would overwrite the reference chapter itself")
    if target.exists() and not force:
        raise FileExistsError(f"{shown(target)} already exists (your work?); pass --force to replace it")
    # Stub everything before touching the disk: a bad marker must not leave a half-made copy.
    find_tasks(package, root)  # the markers of a task must agree on its points, across files too
    stubs = {p: make_stub(p.read_text(), only, package, str(p.relative_to(root))) for p in _sources(source_dir)}
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source_dir, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path, text in stubs.items():
        (target / path.relative_to(source_dir)).write_text(text)
    return target
