"""What `homework check` trusts: the instructor's tests, fixtures and points, never what the student's code left.

- `manifest`: the sha256 of every file under tests/ (test modules, conftest.py files, helpers) and of the pytest
  config, and each chapter's task -> points table; `release` writes it into the release's .course-release.
- `Snapshot.take`, before any student code runs: the bytes of every file the run's tests need (their folders,
  the conftest.py and package files above them, the pytest config) and the chapter's points table; in a
  release, checked against the manifest (a file that differs, or is missing, is tampering; one the manifest
  does not list is left out of the run).
- `Snapshot.private`: the copy of those bytes the worker runs (never the course's own tests/), read-only, with
  two canary tests at the end of every test module (one must pass, one must fail: see runner.py);
  `Snapshot.private_changes` lists what changed in it during the run (content, inode or ctime: a rewrite
  that is undone before the run ends still shows).
- `Snapshot.course_changes`: what changed in the course itself during the run (its tests, config or points
  table), restored from the snapshot in a release.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..chapters import chapters
from ..paths import REPO_ROOT
from .markers import MarkerError
from .tasks import CheckError, find_tasks, task_points

CONFIG = "pyproject.toml"  # pytest's settings (markers, addopts): the run uses the grader's copy
MARKER = ".course-release"  # a JSON file at the top of every release: what was stubbed, from which commit, manifest
_SKIP_PARTS = {"__pycache__", ".pytest_cache", ".hypothesis"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files(folder: Path) -> Iterator[Path]:
    """Every file under `folder`, caches aside, in a stable order."""
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not _SKIP_PARTS & set(path.relative_to(folder).parts) and path.suffix != ".pyc":
            yield path


def _is_test_module(path: PurePosixPath | Path) -> bool:
    """pytest's default python_files: test_*.py or *_test.py."""
    return path.suffix == ".py" and (path.name.startswith("test_") or path.stem.endswith("_test"))


def _shipped(root: Path, path: Path) -> bool:
    """Whether a manifest vouches for `path`: under tests/, or the course's conftest.py or pytest config."""
    return path.is_relative_to(root / "tests") or path in (root / "conftest.py", root / CONFIG)


def manifest(root: Path) -> dict:
    """What a release's grading trusts, hashed: every file under tests/, the course's conftest.py and pytest
    config (path relative to `root` -> sha256), and each chapter's task -> points table."""
    tests = root / "tests"
    paths = [*(_files(tests) if tests.is_dir() else []), root / "conftest.py", root / CONFIG]
    files = {p.relative_to(root).as_posix(): _sha(p.read_bytes()) for p in paths if p.is_file()}
    tables = {package: task_points(find_tasks(package, root)) for package in chapters(root)}
    return {"files": files, "tasks": {package: table for package, table in tables.items() if table}}


def read_manifest(root: Path) -> dict | None:
    """The manifest of the release at `root` (None: not a release, or one made before manifests)."""
    try:
        return json.loads((root / MARKER).read_text()).get("manifest")
    except (OSError, ValueError, AttributeError):
        return None


@dataclass
class Snapshot:
    """A run's tests, config and points as they were before any student code ran, and the private copy made
    of them."""

    root: Path
    package: str
    points: dict[str, int]
    release: bool
    files: dict[Path, bytes] = field(default_factory=dict)  # course file -> its bytes
    places: dict[Path, PurePosixPath] = field(default_factory=dict)  # course file -> its path in the copy
    folders: dict[Path, str] = field(default_factory=dict)  # folder -> what is copied: "tree", "files", "conftest"
    present: set[Path] = field(default_factory=set)  # every file of `folders` before the run
    sources: dict[Path, bytes] = field(default_factory=dict)  # the chapter's source files (restored in a release)
    tests: list[PurePosixPath] = field(default_factory=list)  # the run's test paths, inside the copy
    tampering: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    copy: Path | None = None
    canaries: dict[str, str] = field(default_factory=dict)  # nodeid -> "pass" | "fail"
    expected: dict[str, list[str]] = field(default_factory=dict)  # "module::test" -> the tasks its marker names
    secret: str = ""  # what the failing canaries raise
    stats: dict[str, tuple] = field(default_factory=dict)  # path in the copy -> (kind, inode, ctime, mtime, size, mode)

    @classmethod
    def take(cls, package: str, root: Path, tests: Iterable[str], points: dict[str, int],
             config: Path | None = None) -> Snapshot:
        """Read, before the run, every file the tests of `package` need, and check them against the manifest."""
        root = root.resolve()
        listed = read_manifest(root)
        snap = cls(root, package, dict(points), listed is not None)
        extra = 0
        for test in map(Path, tests):
            test = test.resolve()
            if test.is_relative_to(root):
                relative = test.relative_to(root)
                base = PurePosixPath(relative.as_posix())
                for depth in range(len(relative.parts)):  # conftest.py at the root; every file of the folders below
                    folder = root.joinpath(*relative.parts[:depth])
                    snap.folders.setdefault(folder, "files" if depth else "conftest")
                    for path in snap._direct(folder):
                        snap._add(path, PurePosixPath(path.relative_to(root).as_posix()))
            else:  # --extra-tests outside the course
                extra += 1
                base = PurePosixPath("extra", f"{extra}-{test.name}")
            snap.tests.append(base)
            if test.is_dir():
                snap.folders[test] = "tree"
                for path in _files(test):
                    snap._add(path, base / path.relative_to(test).as_posix())
            elif test.is_file():
                snap._add(test, base)
        config = (config or REPO_ROOT / CONFIG).resolve()
        if config.is_file():
            snap._add(config, PurePosixPath(CONFIG))
        snap.present = set(snap._listing())
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                snap.sources[path] = path.read_bytes()
        if listed is not None:
            snap._check(listed)
        return snap

    def _add(self, path: Path, place: PurePosixPath) -> None:
        self.files[path] = path.read_bytes()
        self.places[path] = place

    def _direct(self, folder: Path) -> list[Path]:
        """The files of `folder` the run copies, without those of its subfolders."""
        if self.folders[folder] == "tree":
            return list(_files(folder))
        if not folder.is_dir():
            return []
        return [p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix != ".pyc"
                and (self.folders[folder] == "files" or p.name == "conftest.py")]

    def _listing(self) -> Iterator[Path]:
        for folder in self.folders:
            yield from self._direct(folder)

    def _copied(self, path: Path) -> bool:
        """Whether the run would copy `path` (if it existed)."""
        return any(path.is_relative_to(f) if how == "tree" else path.parent == f and (
            how == "files" or path.name == "conftest.py") for f, how in self.folders.items())

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() if path.is_relative_to(self.root) else str(path)

    def _check(self, listed: dict) -> None:
        """In a release: every file the run uses must be the one the release shipped, and the points too."""
        hashes: dict[str, str] = listed.get("files", {})
        for path in list(self.files):
            if not _shipped(self.root, path):
                continue  # hidden tests (--extra-tests), or the grader's config when it grades another course
            name = self._relative(path)
            if name not in hashes:  # a file the student added: not the instructor's, so not run
                self.notes.append(f"{name} is not one of the release's test files: the check does not run it")
                del self.files[path], self.places[path]
            elif _sha(self.files[path]) != hashes[name]:
                self.tampering.append(f"{name} differs from the release's copy (the check grades with the "
                                      "instructor's tests only: restore it)")
        for name in hashes:
            path = self.root / name
            if self._copied(path) and not path.is_file():
                self.tampering.append(f"{name} is missing (the release shipped it)")
        shipped = listed.get("tasks", {}).get(self.package)
        if shipped is not None and shipped != self.points:
            self.tampering.append(f"the points of {self.package}'s tasks ({self.points}) differ from the release's "
                                  f"({shipped})")

    # ------------------------------------------------------------ the private copy the worker runs

    def private(self, where: Path, task: str | None) -> None:
        """Write the copy the worker runs to `where` (a folder the grader made), canaries appended to every test
        module, tagged with `task`; then make it read-only and remember every inode and ctime in it."""
        self.copy, self.secret = where, secrets.token_hex(8)
        tag = f'@__import__("pytest").mark.task({task!r})\n' if task else ""
        for path, place in self.places.items():
            target = where / place
            target.parent.mkdir(parents=True, exist_ok=True)
            data = self.files[path]
            if _is_test_module(place) and any(place.is_relative_to(t) for t in self.tests):
                self.expected.update({f"{place}::{name}": tasks for name, tasks in tagged_tests(data).items()})
                passing, failing = (f"test_{secrets.token_hex(6)}" for _ in range(2))
                self.canaries[f"{place}::{passing}"] = "pass"
                self.canaries[f"{place}::{failing}"] = "fail"
                data += (f"\n\n\n{tag}def {passing}():\n    pass\n\n\n"
                         f"{tag}def {failing}():\n    raise AssertionError({self.secret!r})\n").encode()
            target.write_bytes(data)
        _chmod(where, writable=False)
        self.stats = dict(_stats(where))

    def private_changes(self) -> list[str]:
        """What changed in the private copy since `private` (its paths), then make it writable again (so that
        it can be removed)."""
        if self.copy is None:
            return []
        now = dict(_stats(self.copy))
        changed = sorted(p for p in self.stats.keys() | now.keys() if self.stats.get(p) != now.get(p))
        _chmod(self.copy, writable=True)
        return changed

    # ------------------------------------------------------------ the course, after the run

    def course_changes(self) -> list[str]:
        """What the run changed in the course: its test files, conftest files, config, or the chapter's points;
        in a release, every change is undone from the snapshot."""
        out = []
        for path, data in self.files.items():
            try:
                now = path.read_bytes()
            except OSError:
                now = None
            if now != data:
                out.append(f"{self._relative(path)} was {'deleted' if now is None else 'changed'}")
        added = sorted(set(self._listing()) - self.present)
        out += [f"{self._relative(path)} was added" for path in added]
        try:
            table = task_points(find_tasks(self.package, self.root))
        except (CheckError, MarkerError, OSError, SyntaxError, UnicodeDecodeError) as exc:
            table = {"unreadable markers": str(exc)}
        if table != self.points:
            moved = [f"{t}: {self.points.get(t)} -> {table.get(t)}" for t in self.points.keys() | table.keys()
                     if self.points.get(t) != table.get(t)]
            out.append(f"the points on the markers of {self.package} changed ({', '.join(sorted(moved))})")
        if out and self.release:
            self._restore(added)
        return out

    def _restore(self, added: list[Path]) -> None:
        for path, data in [*self.files.items(), *self.sources.items()]:
            try:
                same = path.read_bytes() == data
            except OSError:
                same = False
            if not same:
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.is_symlink() or path.exists():
                    path.unlink()
                path.write_bytes(data)
        for path in added:
            path.unlink(missing_ok=True)


def _task_marks(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> list[str]:
    """The ids of the literal `@<...>.mark.task("id")` decorators of a definition."""
    return [d.args[0].value for d in node.decorator_list
            if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "task"
            and isinstance(d.func.value, ast.Attribute) and d.func.value.attr == "mark"
            and d.args and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str)]


def tagged_tests(source: bytes) -> dict[str, list[str]]:
    """The test functions of a module (and methods of its Test* classes) that a literal task marker tags, as
    "name" or "TestClass::name" -> their task ids: collecting the module must yield at least one item of each."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            if tasks := _task_marks(node):
                out[node.name] = tasks
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for method in node.body:
                if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef) and method.name.startswith("test"):
                    if tasks := _task_marks(method) + _task_marks(node):
                        out[f"{node.name}::{method.name}"] = tasks
    return out


def _stats(folder: Path) -> Iterator[tuple[str, tuple]]:
    """Every path under `folder` with what a change to it changes: inode, ctime (no process can set it back),
    mtime, size and mode."""
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            yield (os.path.relpath(path, folder),
                   (stat.S_IFMT(st.st_mode), st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size, st.st_mode))
    try:
        st = os.lstat(folder)
    except OSError:
        return  # removed: every path of it differs
    yield ".", (stat.S_IFMT(st.st_mode), st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size, st.st_mode)


def _chmod(folder: Path, writable: bool) -> None:
    """Files 0444 and folders 0555 (or back to 0644 / 0755): the copy is read-only to the worker's tests."""
    files, folders = (0o644, 0o755) if writable else (0o444, 0o555)
    with contextlib.suppress(OSError):  # the student's code may have removed or locked some of it: tampering
        os.chmod(folder, folders)
    for dirpath, dirnames, filenames in os.walk(folder):
        for names, mode in ((dirnames, folders), (filenames, files)):
            for name in names:
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    with contextlib.suppress(OSError):
                        os.chmod(path, mode)
