"""A chapter's homework tasks, found from its markers, and the student copy with their bodies stubbed."""
from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from ..chapters import chapters
from ..paths import REPO_ROOT, shown
from .markers import MarkerError, Region, check_points, find_regions, is_stub, make_stub

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


def submission_files(chapter: str, root: Path | None = None) -> list[str]:
    """The files a student hands in for `chapter`: those of its package that hold a task's markers (the ones
    `start` stubs), as paths relative to the package folder, in the order of the package's files. `start` prints
    them and the autograder looks for them in an upload."""
    files = {r.file for regions in find_tasks(chapter, root).values() for r in regions}
    return [Path(*f.parts[1:]).as_posix() for f in sorted(files)]


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


class Earlier(NamedTuple):
    """A chapter that `builder` builds on, as the student's homework folder holds it."""

    package: str
    builder: str
    copy: Path  # where the student's copy is, or would be
    has_copy: bool
    reference: bool  # the course holds its reference bodies (in a student release they are stubs too)
    unsolved: list[str]  # its tasks still stubs in the copy (with no copy and no reference: all of them)

    @property
    def from_copy(self) -> bool:
        """Whether `homework check` imports it from the student's copy (a student release: no reference)."""
        return self.has_copy and not self.reference

    def note(self) -> str | None:
        """What `check` reports about it and `start` warns about (None: nothing to say)."""
        which = f"{self.package} (which {self.builder} builds on)"
        stubs = ", ".join(self.unsolved)
        if self.from_copy:
            return f"{which} is imported from your copy {shown(self.copy)}" + (
                f", which still has stubs ({stubs}): tests that run them fail until you write them" if stubs else "")
        if not self.has_copy:
            return None if self.reference else (
                f"{which} is stubbed in the course and you have no copy of it: tests that run its code fail; run "
                f"`python -m course homework start {self.package.split('_')[0]}` and solve it first")
        return (f"your copy {shown(self.copy)} of {which} still has stubs ({stubs}); `check` grades {self.builder} "
                f"against the course's own {self.package}, but solve {self.package} first") if stubs else None


def earlier_chapters(chapter: str, dest: Path | str = DEFAULT_DEST, root: Path | None = None) -> list[Earlier]:
    """The chapters with tasks before `chapter`, as the homework folder `dest` holds them: the one place that
    knows whether an earlier chapter is still a stub for the student (`start` warns, `check` notes and
    imports the student's copy in a student release)."""
    root = root or REPO_ROOT
    package, _ = resolve_chapter(chapter, root)
    dest = Path(dest).resolve()
    out = []
    for earlier in chapters(root)[: chapters(root).index(package)]:
        tasks = find_tasks(earlier, root)
        if not tasks:
            continue
        reference = not stubbed_tasks(earlier, root)
        has_copy = (dest / earlier / "__init__.py").is_file()
        if has_copy:
            order = {t: i for i, t in enumerate(tasks)}
            try:
                unsolved = sorted(stubbed_tasks(earlier, dest), key=lambda t: (order.get(t, len(order)), t))
            except (MarkerError, SyntaxError):  # the student broke a marker or the file: say nothing, not guess
                unsolved = []
        else:
            unsolved = [] if reference else list(tasks)
        out.append(Earlier(earlier, package, dest / earlier, has_copy, reference, unsolved))
    return out


def start(chapter: str, dest: Path | str = DEFAULT_DEST, force: bool = False, only: set[str] | None = None,
          root: Path | None = None, beside: dict[str, str] | None = None) -> Path:
    """Copy the chapter to `dest/<package>` with the marked bodies stubbed, and the files of `beside` (name -> text)
    in it, each kept instead when the copy being replaced has one (the student's own: written.start_with_sheet
    puts the answer sheet there); returns the copy's folder."""
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
    beside = {name: (target / name).read_text() if (target / name).is_file() else text
              for name, text in (beside or {}).items()}
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source_dir, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path, text in stubs.items():
        (target / path.relative_to(source_dir)).write_text(text)
    for name, text in beside.items():
        (target / name).write_text(text)
    return target
