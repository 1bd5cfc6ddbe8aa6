"""Homework: student copies of a chapter with the marked bodies stubbed out, and per-task grading.

Reference code marks what a student writes (nbgrader convention)::

    # BEGIN SOLUTION task2.schedule points=3
    ...reference body...
    # END SOLUTION

`start` copies the chapter package to `homework/<package>/` with every marked body replaced by
`raise NotImplementedError(...)`. `check` runs the chapter's tests against that copy in a worker
process: the worker imports the chapter package from the copy (and only that package: other chapters
still come from the reference), checks where it came from, then runs pytest in the same interpreter
with a per-test timeout and a small reporter plugin. One worker can run many checks, so torch is
imported once; that is what keeps the suite-wide proof (tests/test_homework_proof.py) fast. In a
student release (`course.release`) there is no reference: the earlier chapters a chapter builds on are
stubbed too, so they come from the student's own copies when there are any.

Scoring rule: a task earns its points (`points=N` on its markers, default 1) when it has at least one
test, none of its tests fails or errors, and at least one passes (skips are neutral). Untagged tests are
reported but do not score. A test module that cannot even be collected zeroes every task, since its
tests cannot be attributed.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple, TextIO

import pytest

from .chapters import chapters
from .paths import REPO_ROOT

DEFAULT_DEST = REPO_ROOT / "homework"
RULE = ("a task earns its points (1 unless its marker says points=N) when all of its tests pass "
        "(at least one must pass; skips are neutral)")

_BEGIN = re.compile(r"^(?P<indent>[ \t]*)#\s*BEGIN SOLUTION\b(?P<rest>.*)$")
_END = re.compile(r"^(?P<indent>[ \t]*)#\s*END SOLUTION\b(?P<rest>.*)$")
_TASK_ID = re.compile(r"[\w.\-]+")
_POINTS = re.compile(r"points=([1-9][0-9]*)")


class MarkerError(ValueError):
    """Malformed BEGIN/END SOLUTION markers in reference code (the message names file and line)."""


class CheckError(RuntimeError):
    """The check could not run at all (as opposed to running and scoring low)."""


class Region(NamedTuple):
    """One marked body: lines `begin` and `end` are the BEGIN and END comments (1-based); `points` is what
    the task is worth (`points=N` on the BEGIN line, default 1)."""

    file: Path
    begin: int
    end: int
    task: str
    function: str
    points: int = 1


# ---------------------------------------------------------------- markers and stubs


def _parse_begin(rest: str, filename: str, n: int) -> tuple[str, int]:
    """'task2.schedule points=3' -> ('task2.schedule', 3); the points default to 1."""
    words = rest.split()
    if not words or not _TASK_ID.fullmatch(words[0]) or "=" in words[0]:
        raise MarkerError(f"{filename}:{n}: BEGIN SOLUTION needs exactly one task id, "
                          f"e.g. '# BEGIN SOLUTION task1.rope' (got {rest.strip()!r})")
    points = 1
    for i, word in enumerate(words[1:]):
        m = _POINTS.fullmatch(word)
        if not m or i:
            raise MarkerError(f"{filename}:{n}: BEGIN SOLUTION {words[0]} takes one option, points=N "
                              f"(a positive integer), e.g. '# BEGIN SOLUTION {words[0]} points=3' (got {word!r})")
        points = int(m[1])
    return words[0], points


def _scan(source: str, filename: str) -> list[tuple[str, int, int, int]]:
    """(task, begin, end, points) of every marked region; raises MarkerError on any inconsistency."""
    found: list[tuple[str, int, int, int]] = []
    opened: tuple[str, int, str, int] | None = None
    for n, line in enumerate(source.splitlines(), 1):
        if m := _BEGIN.match(line):
            if opened:
                raise MarkerError(f"{filename}:{n}: BEGIN SOLUTION inside the region opened at line {opened[1]} "
                                  "(regions cannot nest; close it with # END SOLUTION first)")
            task, points = _parse_begin(m["rest"], filename, n)
            opened = (task, n, m["indent"], points)
        elif m := _END.match(line):
            if not opened:
                raise MarkerError(f"{filename}:{n}: END SOLUTION without a BEGIN SOLUTION before it")
            task, begin, indent, points = opened
            if m["rest"].strip() not in ("", task):
                raise MarkerError(f"{filename}:{n}: END SOLUTION {m['rest'].strip()} closes the region of "
                                  f"{task} opened at line {begin}")
            if m["indent"] != indent:
                raise MarkerError(f"{filename}:{n}: END SOLUTION is indented differently from its BEGIN SOLUTION "
                                  f"at line {begin}")
            found.append((task, begin, n, points))
            opened = None
    if opened:
        raise MarkerError(f"{filename}:{opened[1]}: BEGIN SOLUTION {opened[0]} is never closed by # END SOLUTION")
    return found


def _functions(tree: ast.AST) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function def with a dotted name (Class.method, outer.inner), in source order."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if not isinstance(child, ast.ClassDef):
                    out.append((prefix + child.name, child))
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def find_regions(source: str, filename: str = "<source>") -> list[Region]:
    """The marked regions of one file; each must sit inside a function body (a stub is a `raise`)."""
    marked = _scan(source, filename)
    if not marked:
        return []
    funcs = _functions(ast.parse(source, filename))
    regions = []
    for task, begin, end, points in marked:
        around = [(node.lineno, name) for name, node in funcs if node.lineno < begin <= (node.end_lineno or 0)]
        if not around:
            raise MarkerError(f"{filename}:{begin}: BEGIN SOLUTION {task} is not inside a function body")
        regions.append(Region(Path(filename), begin, end, task, max(around)[1], points))
    _check_points(regions)
    return regions


def _check_points(regions: Iterable[Region]) -> None:
    """Every marker of a task must give it the same points (an absent points= means 1)."""
    first: dict[str, Region] = {}
    for r in regions:
        seen = first.setdefault(r.task, r)
        if seen.points != r.points:
            raise MarkerError(f"{r.file}:{r.begin}: {r.task} is worth points={r.points} here but points={seen.points} "
                              f"at {seen.file}:{seen.begin}; every BEGIN SOLUTION of a task must give the same points")


def make_stub(source: str, only: set[str] | None = None, chapter: str | None = None,
              filename: str = "<source>") -> str:
    """`source` with each marked body (of the tasks in `only`, or all) replaced by a NotImplementedError.

    The BEGIN/END comments stay, so the stub can be found again and the student sees where to write.
    """
    lines = source.splitlines(keepends=True)
    where = f"see {chapter}/README.md#exercises" if chapter else "not implemented yet"
    for r in reversed(find_regions(source, filename)):
        if only is None or r.task in only:
            begin_line = lines[r.begin - 1]
            indent = begin_line[: len(begin_line) - len(begin_line.lstrip())]
            lines[r.begin:r.end - 1] = [f'{indent}raise NotImplementedError("{r.task}: {where}")\n']
    stub = "".join(lines)
    try:
        ast.parse(stub, filename)
    except SyntaxError as exc:
        raise MarkerError(f"{filename}:{exc.lineno}: the stub is not valid Python ({exc.msg}); is the "
                          "BEGIN SOLUTION comment indented like the code it replaces?") from None
    return stub


def signatures(source: str) -> list[str]:
    """What a stub must keep of every function: decorators, name, arguments, defaults, return, docstring."""
    out = []
    for name, node in _functions(ast.parse(source)):
        decorators = "".join(f"@{ast.unparse(d)} " for d in node.decorator_list)
        kind = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
        returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
        out.append(f"{decorators}{kind} {name}({ast.unparse(node.args)}){returns}: {ast.get_docstring(node)!r}")
    return out


# ---------------------------------------------------------------- chapters


def resolve_chapter(chapter: str, root: Path | None = None) -> tuple[str, Path]:
    """'step01' or 'step01_kvcache' -> (package name, its tests folder tests/step01)."""
    root = root or REPO_ROOT
    name = chapter.strip().rstrip("/\\")
    packages = chapters(root)
    matches = [p for p in packages if p == name or p.split("_")[0] == name]
    if len(matches) != 1:
        raise CheckError(f"unknown chapter {chapter!r}; chapters: {', '.join(packages) or 'none'}")
    return matches[0], root / "tests" / matches[0].split("_")[0]


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
    _check_points(r for regions in tasks.values() for r in regions)
    return tasks


def task_points(tasks: dict[str, list[Region]]) -> dict[str, int]:
    """Task id -> what it is worth."""
    return {task: regions[0].points for task, regions in tasks.items()}


_STUB = re.compile(r'\s*raise NotImplementedError\("(?P<task>[\w.\-]+): [^"\n]*"\)\s*')


def is_stub(source: str, region: Region) -> bool:
    """Whether the marked body of `region` in `source` is a stub (a lone `raise NotImplementedError`)."""
    body = "".join(source.splitlines(keepends=True)[region.begin:region.end - 1])
    return bool(m := _STUB.fullmatch(body)) and m["task"] == region.task


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
        raise FileExistsError(f"{_show(target)} already exists (your work?); pass --force to replace it")
    # Stub everything before touching the disk: a bad marker must not leave a half-made copy.
    find_tasks(package, root)  # the markers of a task must agree on its points, across files too
    stubs = {p: make_stub(p.read_text(), only, package, str(p.relative_to(root))) for p in _sources(source_dir)}
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source_dir, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path, text in stubs.items():
        (target / path.relative_to(source_dir)).write_text(text)
    return target


# ---------------------------------------------------------------- the worker (runs inside the subprocess)


@dataclass
class Run:
    """One pytest run of a chapter's tests against the copy `dest/<package>`."""

    package: str
    dest: str
    tests: list[str]
    rootdir: str
    timeout: float
    tasks: list[str] | None = None  # run only the tests tagged with one of these tasks
    import_timeout: float = 120.0  # the first import of a chapter pays for torch too
    report: str = ""  # JSON-lines file the worker appends events to
    built_on: list[str] = field(default_factory=list)  # earlier chapters imported from their copies in `dest`
    notes: list[str] = field(default_factory=list)  # said in the report (e.g. an earlier chapter left stubbed)


def _task_ids(item: pytest.Item) -> list[str]:
    return [m.args[0] for m in item.iter_markers("task") if m.args]


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    """One line: the exception of a failure, the reason of a skip."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # skip: (path, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    lines = [line for line in str(crash.message if crash else longrepr).splitlines() if line.strip()]
    text = (lines[0] if crash else lines[-1]) if lines else "(no message)"
    return text if len(text) <= 300 else text[:297] + "..."


def _foreign(package: str, copy: Path) -> list[str]:
    """Modules of `package` that were not loaded from the copy (should be none)."""
    bad = []
    for name, module in list(sys.modules.items()):
        if name != package and not name.startswith(package + "."):
            continue
        file = getattr(module, "__file__", None)
        places = [file] if file else list(getattr(module, "__path__", []))
        if not places or not all(Path(p).resolve().is_relative_to(copy) for p in places):
            bad.append(f"{name} from {', '.join(map(str, places)) or '?'}"
                       + ("" if file else " (a namespace package: is __init__.py missing?)"))
    return bad


class _Reporter:
    """pytest plugin: selects tests by task, re-checks the chapter's origin, logs one JSON line per event."""

    def __init__(self, out: TextIO, run: Run) -> None:
        self.out, self.run = out, run
        self.copy = (Path(run.dest) / run.package).resolve()
        self.outcomes: dict[str, tuple[str, str]] = {}
        self.tags: list[str] = []

    def emit(self, event: str, **data: object) -> None:
        self.out.write(json.dumps({"event": event, **data}) + "\n")
        self.out.flush()

    def pytest_configure(self, config: pytest.Config) -> None:
        config.addinivalue_line("markers", "task(id): the homework task this test grades")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        self.tags = sorted({t for item in items for t in _task_ids(item)})  # before selecting: typos show up
        if self.run.tasks is None:
            return
        wanted = set(self.run.tasks)
        keep = [item for item in items if wanted & set(_task_ids(item))]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.emit("collect_error", nodeid=report.nodeid, message=_message(report))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if bad := _foreign(self.run.package, self.copy):  # a test or conftest re-imported the reference
            self.emit("fatal", message=f"not graded against the copy {self.copy}: {'; '.join(bad)}")
            pytest.exit("chapter not imported from the student copy", returncode=3)
        self.emit("collected", tags=self.tags,
                  tests=[{"nodeid": i.nodeid, "tasks": _task_ids(i)} for i in session.items])

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.emit("start", nodeid=nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome, _ = self.outcomes.get(report.nodeid, ("passed", ""))
        if report.failed and outcome in ("passed", "skipped"):
            self.outcomes[report.nodeid] = ("failed" if report.when == "call" else "error", _message(report))
        elif report.skipped and not hasattr(report, "wasxfail") and outcome == "passed":
            self.outcomes[report.nodeid] = ("skipped", _message(report))

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        outcome, message = self.outcomes.pop(nodeid, ("passed", ""))
        self.emit("result", nodeid=nodeid, outcome=outcome, message=message,
                  timeout="Timeout" in message and "pytest-timeout" in message)


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the main thread after `seconds` (an import that loops forever)."""
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds:g}s (an infinite loop at import time?)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _import_error(exc: BaseException, copy: Path) -> str:
    """Where in the copy the import broke and why, in a few lines instead of a traceback wall."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve().is_relative_to(copy)]
    where = f"  {_show(Path(frames[-1].filename))}:{frames[-1].lineno}, in {frames[-1].name}\n" if frames else ""
    what = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    return f"{where}  {what.replace(chr(10), chr(10) + '  ')}"


def _forget_project_modules(dirs: Iterable[Path]) -> None:
    """Drop modules loaded from the course (not from the venv) so the next run imports them afresh."""
    venv = Path(sys.prefix).resolve()
    roots = [d.resolve() for d in dirs]
    for name, module in list(sys.modules.items()):
        if name in ("course", __name__):
            continue
        file = getattr(module, "__file__", None)
        places = [Path(file).resolve()] if file else [Path(p).resolve() for p in getattr(module, "__path__", [])]
        if any(any(p.is_relative_to(r) for r in roots) and not p.is_relative_to(venv) for p in places):
            del sys.modules[name]


def _import_copy(package: str, copy: Path) -> None:
    """Import `package` from the folder `copy`, without putting the copy's parent on sys.path: its
    submodules load through the package's __path__, while other chapters (say, the step01 that step02
    builds on) keep coming from the reference even if the homework folder holds a copy of them too."""
    spec = importlib.util.spec_from_file_location(package, copy / "__init__.py", submodule_search_locations=[str(copy)])
    assert spec is not None and spec.loader is not None
    sys.modules[package] = module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[package]
        raise


def _run_in_process(run: Run, out: TextIO) -> None:
    reporter, began, saved = _Reporter(out, run), time.perf_counter(), sys.path[:]
    dirs = [Path(run.dest), Path(run.rootdir), REPO_ROOT, *map(Path, run.tests)]
    _forget_project_modules(dirs)
    importlib.invalidate_caches()
    try:
        for package in [*run.built_on, run.package]:
            copy = (Path(run.dest) / package).resolve()
            try:
                with _time_limit(run.import_timeout):
                    _import_copy(package, copy)
            except (Exception, SystemExit) as exc:
                what = "" if package == run.package else f"your copy of {package}, which {run.package} builds on:\n"
                reporter.emit("import_error", message=what + _import_error(exc, copy))
                return
        if bad := _foreign(run.package, reporter.copy):
            reporter.emit("fatal", message=f"imported {'; '.join(bad)}, not the copy {reporter.copy}")
            return
        # signal method: a looping test gets an exception and fails alone (the thread method ends the run).
        args = [*run.tests, "-c", str(REPO_ROOT / "pyproject.toml"), "--rootdir", run.rootdir,
                "--confcutdir", run.rootdir, "-p", "no:cacheprovider", "-p", "no:nbmake", "-q",
                "--continue-on-collection-errors", f"--timeout={run.timeout:g}", "--timeout-method=signal"]
        code = int(pytest.main(args, plugins=[reporter]))
        reporter.emit("done", exit_code=code, seconds=round(time.perf_counter() - began, 2))
    finally:
        sys.path[:] = saved
        _forget_project_modules(dirs)


def _worker(spec: str) -> None:
    """Entry point of the worker process: run each Run of the spec file in turn."""
    for fields in json.loads(Path(spec).read_text()):
        run = Run(**fields)
        with open(run.report, "a") as out:
            _run_in_process(run, out)
        sys.stdout.flush()


# ---------------------------------------------------------------- checks (in the calling process)


def plan(chapter: str, dest: Path | str = DEFAULT_DEST, timeout: float = 60.0, extra_tests: Path | str | None = None,
         tasks: Iterable[str] | None = None, root: Path | None = None, tests_dir: Path | str | None = None) -> Run:
    """The Run that checks the copy `dest/<package>` of `chapter` against its tests."""
    root = (root or REPO_ROOT).resolve()
    package, default_tests = resolve_chapter(chapter, root)
    dest = Path(dest).resolve()
    if not (dest / package / "__init__.py").is_file():
        raise CheckError(f"no student copy at {_show(dest / package)}; "
                         f"run: python -m course homework start {chapter}")
    if tasks is not None and (unknown := set(tasks) - set(find_tasks(package, root))):
        raise CheckError(f"unknown task(s) {', '.join(sorted(unknown))}; {package} has: "
                         f"{', '.join(find_tasks(package, root))}")
    tests = [Path(tests_dir or default_tests).resolve()] + ([Path(extra_tests).resolve()] if extra_tests else [])
    for path in tests:
        if not path.exists():
            raise CheckError(f"no tests at {_show(path)}")
    built_on, notes = _earlier_copies(package, dest, root)
    return Run(package, str(dest), [str(p) for p in tests], str(root), float(timeout),
               list(tasks) if tasks is not None else None, built_on=built_on, notes=notes)


def _earlier_copies(package: str, dest: Path, root: Path) -> tuple[list[str], list[str]]:
    """In a student release the chapters before `package` are stubbed too, and a chapter builds on them:
    those come from the student's own copies in `dest` when there are any. In the instructor's repository
    (reference bodies) they always come from the reference."""
    built_on, notes = [], []
    for earlier in chapters(root)[: chapters(root).index(package)]:
        if not stubbed_tasks(earlier, root):
            continue
        if (dest / earlier / "__init__.py").is_file():
            built_on.append(earlier)
            notes.append(f"{earlier} (which {package} builds on) is imported from your copy {_show(dest / earlier)}")
        else:
            notes.append(f"{earlier} (which {package} builds on) is stubbed in {_show(root / earlier)} and you have "
                         f"no copy of it: tests that run its code fail; run `python -m course homework start "
                         f"{earlier.split('_')[0]}` and solve it first")
    return built_on, notes


def execute(runs: list[Run], total_timeout: float = 1800.0, workers: int = 1, verbose: bool = False) -> list[dict]:
    """Run `runs` in `workers` worker processes (each imports torch once) and summarize each run."""
    with tempfile.TemporaryDirectory(prefix="kvcourse-check-") as tmp:
        for i, run in enumerate(runs):
            run.report = str(Path(tmp) / f"run{i}.jsonl")
            Path(run.report).touch()
        paths = dict.fromkeys([r.rootdir for r in runs] + [str(REPO_ROOT)])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        env.pop("PYTEST_ADDOPTS", None)
        procs, logs = [], []
        for w in range(min(workers, len(runs))):
            spec = Path(tmp) / f"worker{w}.json"
            spec.write_text(json.dumps([asdict(r) for r in runs[w::workers]]))
            log = None if verbose else open(Path(tmp) / f"worker{w}.log", "w+")
            logs.append(log)
            cmd = [sys.executable, "-c", "import sys; from course.homework import _worker; _worker(sys.argv[1])",
                   str(spec)]
            procs.append(subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline, stopped = time.monotonic() + total_timeout, {}
        try:
            for w, proc in enumerate(procs):
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    stopped[w] = f"the whole check ran past its time limit ({total_timeout:g}s)"
        finally:
            for w, proc in enumerate(procs):
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                if proc.returncode and w not in stopped:
                    stopped[w] = f"the test process died (exit code {proc.returncode})"
        tails = []
        for log in logs:
            if log:
                log.seek(0)
                tails.append(log.read()[-3000:])
                log.close()
        return [_summarize(run, Path(run.report).read_text(), stopped.get(i % len(procs)), "\n".join(tails))
                for i, run in enumerate(runs)]


def check(chapter: str, dest: Path | str = DEFAULT_DEST, timeout: float = 60.0, extra_tests: Path | str | None = None,
          tasks: Iterable[str] | None = None, root: Path | None = None, tests_dir: Path | str | None = None,
          total_timeout: float = 1800.0, verbose: bool = False) -> dict:
    """Grade the copy `dest/<package>`: the JSON-able result that `check --json` prints."""
    run = plan(chapter, dest, timeout, extra_tests, tasks, root, tests_dir)
    return execute([run], total_timeout, verbose=verbose)[0]


def _counts() -> dict[str, int]:
    return {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "total": 0}


def _summarize(run: Run, log: str, stopped: str | None, output: str) -> dict:
    """Per-task counts and points from the worker's events; `stopped` says why the worker ended early."""
    events = [json.loads(line) for line in log.splitlines() if line.strip()]
    worth = task_points(find_tasks(run.package, Path(run.rootdir)))
    order = list(worth)
    marked = set(order)
    collected: dict[str, list[str]] = {}
    unknown: set[str] = set()
    results: dict[str, tuple[str, str, bool]] = {}
    started, exit_code, seconds, error, collect_errors = None, None, None, None, []
    for e in events:
        kind = e["event"]
        if kind == "collected":
            collected = {t["nodeid"]: t["tasks"] for t in e["tests"]}
            unknown = set(e["tags"]) - marked
        elif kind == "start":
            started = e["nodeid"]
        elif kind == "result":
            results[e["nodeid"]] = (e["outcome"], e["message"], e["timeout"])
        elif kind == "collect_error":
            collect_errors.append({"nodeid": e["nodeid"], "message": e["message"]})
        elif kind == "import_error":
            error = f"the copy does not import:\n{e['message']}"
        elif kind == "fatal":
            raise CheckError(e["message"])
        elif kind == "done":
            exit_code, seconds = e["exit_code"], e["seconds"]
    if exit_code is None and error is None:
        if not stopped:
            raise CheckError(f"the check ended without a result; its output ended with:\n{output}")
        error = f"stopped: {stopped}" + (f"; its output ended with:\n{output[-1000:]}" if "died" in stopped else "")
    if exit_code in (2, 3, 4) and not collected:
        raise CheckError(f"pytest could not run (exit code {exit_code}); its output ended with:\n{output}")
    for nodeid in collected:  # pytest stopped early: blame the running test, the others never ran
        if nodeid not in results:
            why = stopped or f"pytest stopped early (exit code {exit_code})"
            results[nodeid] = ("failed", why, False) if nodeid == started else ("error", f"not run: {why}", False)

    tasks = {t: _counts() for t in (order if run.tasks is None else run.tasks)}
    untagged, failures = _counts(), []
    field = {"passed": "passed", "failed": "failed", "error": "errors", "skipped": "skipped"}
    for nodeid, names in collected.items():
        outcome, message, timed_out = results[nodeid]
        buckets = [tasks[n] for n in names if n in tasks] or ([] if marked & set(names) else [untagged])
        for bucket in buckets:
            bucket[field[outcome]] += 1
            bucket["total"] += 1
        if outcome in ("failed", "error"):
            failures.append({"nodeid": nodeid, "tasks": names, "outcome": "timeout" if timed_out else outcome,
                             "message": message})
    rows = []
    for task, c in tasks.items():
        earned = not collect_errors and c["passed"] > 0 and c["failed"] == c["errors"] == 0
        rows.append({"id": task, **c, "points": worth[task] if earned else 0, "max_points": worth[task]})
    return {"chapter": run.package, "copy": str(Path(run.dest) / run.package), "tasks": rows,
            "score": sum(r["points"] for r in rows), "max_score": sum(r["max_points"] for r in rows),
            "untagged": untagged, "unknown_tasks": sorted(unknown), "failures": failures,
            "collect_errors": collect_errors, "error": error, "seconds": seconds, "notes": run.notes, "rule": RULE}


# ---------------------------------------------------------------- command line


def _show(path: Path) -> str:
    """A path relative to the working directory when it is below it (shorter to read)."""
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd()))
    return str(path)


def _print_report(result: dict, chapter: str) -> None:
    print(f"{result['chapter']}: checking {_show(Path(result['copy']))}")
    if result["error"]:
        print(f"\n{result['error']}")
    for note in result.get("notes", []):
        print(f"note: {note}")
    width = max([len(r["id"]) for r in result["tasks"]] + [8])
    print(f"\n  {'task':<{width}}  passed/total  points")
    for r in result["tasks"]:
        extra = ", ".join(f"{r[k]} {k}" for k in ("failed", "errors", "skipped") if r[k])
        earned = f"{r['points']}/{r['max_points']}"
        print(f"  {r['id']:<{width}}  {r['passed']:>6}/{r['total']:<5}  {earned:>6}   {extra}".rstrip())
    u = result["untagged"]
    if u["total"]:
        print(f"  {'untagged':<{width}}  {u['passed']:>6}/{u['total']:<5}  {'-':>6}   (not scored)")
    print(f"\nscore: {result['score']}/{result['max_score']}   rule: {RULE}")
    for c in result["collect_errors"]:
        print(f"\ncould not collect {c['nodeid']}: {c['message']}  (every task scores 0 until it imports)")
    if result["failures"]:
        print("\nfailing tests:")
        for f in result["failures"][:20]:
            print(f"  {f['outcome'].upper():7} {f['nodeid']} [{', '.join(f['tasks']) or 'untagged'}]\n"
                  f"          {f['message']}")
        if len(result["failures"]) > 20:
            print(f"  ... and {len(result['failures']) - 20} more (--json lists them all)")
        print(f"\nfull tracebacks: python -m course homework check {chapter} --verbose [--task TASK_ID]")
    if result["unknown_tasks"]:
        print(f"\nwarning: tests tagged with unknown tasks: {', '.join(result['unknown_tasks'])}")


def gradescope(result: dict) -> dict:
    """The check's result as Gradescope's autograder results.json: one test per task, worth its points."""
    failing: dict[str, list[str]] = {}
    for f in result["failures"]:
        for task in f["tasks"]:
            failing.setdefault(task, []).append(f"{f['outcome'].upper()} {f['nodeid']}\n    {f['message']}")
    problems = [result["error"]] if result["error"] else []
    problems += [f"could not collect {c['nodeid']}: {c['message']} (every task scores 0 until it imports)"
                 for c in result["collect_errors"]]
    tests = []
    for r in result["tasks"]:
        lines = [f"{r['passed']}/{r['total']} tests pass" + "".join(
            f", {r[k]} {k}" for k in ("failed", "errors", "skipped") if r[k])]
        lines += failing.get(r["id"], [])[:10] + problems
        tests.append({"name": r["id"], "score": r["points"], "max_score": r["max_points"],
                      "output": "\n".join(lines), "visibility": "visible"})
    summary = [f"{result['chapter']}: {result['score']}/{result['max_score']} points", *result.get("notes", []),
               *problems]
    return {"score": result["score"], "execution_time": result["seconds"] or 0, "output": "\n".join(summary),
            "visibility": "visible", "stdout_visibility": "visible", "tests": tests}


def _unrunnable(chapter: str, message: str, root: Path | None) -> dict:
    """A zero result for a check that could not run (Gradescope still needs a results file)."""
    try:
        package, _ = resolve_chapter(chapter, root)
        worth = task_points(find_tasks(package, root))
    except (CheckError, MarkerError):
        package, worth = chapter, {}
    rows = [{"id": t, **_counts(), "points": 0, "max_points": p} for t, p in worth.items()]
    return {"chapter": package, "copy": "", "tasks": rows, "score": 0, "max_score": sum(worth.values()),
            "untagged": _counts(), "unknown_tasks": [], "failures": [], "collect_errors": [], "error": message,
            "seconds": None, "notes": [], "rule": RULE}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m course homework",
                                     description="Student copies of a chapter and per-task grading.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="copy a chapter to homework/ with the marked bodies stubbed out")
    p_check = sub.add_parser("check", help="run the chapter's tests against your copy and score each task")
    for p in (p_start, p_check):
        p.add_argument("chapter", help="step01 or step01_kvcache")
        p.add_argument("--dest", type=Path, default=DEFAULT_DEST, metavar="DIR",
                       help="folder of student copies (default: homework/)")
        p.add_argument("--root", type=Path, help=argparse.SUPPRESS)  # another course checkout (for tests)
    p_start.add_argument("--force", action="store_true", help="replace an existing copy (your edits are lost)")
    p_release = sub.add_parser("release", help="write a student edition of the course: marked bodies stubbed, "
                               "instructor-only files left out")
    p_release.add_argument("dest", type=Path, metavar="DIR", help="where to write it (must not exist, or be empty)")
    p_release.add_argument("--chapters", nargs="+", metavar="CHAPTER",
                           help="the chapters handed out as homework (default: all); the others keep their "
                                "reference bodies")
    p_release.add_argument("--force", action="store_true", help="replace DIR if it holds an earlier release")
    p_check.add_argument("--json", action="store_true", help="print only one JSON object (same as --format json)")
    p_check.add_argument("--format", choices=("table", "json", "gradescope"), default=None,
                         help="table (default), json (one object on the last line) or gradescope (results.json)")
    p_check.add_argument("--output", type=Path, metavar="FILE",
                         help="write the json / gradescope result to FILE instead of printing it")
    p_check.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds per test (default 60)")
    p_check.add_argument("--total-timeout", type=float, default=1800.0, metavar="S", help="seconds for the whole check")
    p_check.add_argument("--extra-tests", type=Path, metavar="DIR", help="another folder of tests to run as well")
    p_check.add_argument("--task", action="append", metavar="ID", help="check only this task (repeatable)")
    p_check.add_argument("--scored-only", action="store_true", help="skip untagged tests (they do not score)")
    p_check.add_argument("--verbose", action="store_true", help="show pytest's own output (tracebacks)")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            target = start(args.chapter, args.dest, args.force, root=args.root)
            tasks = find_tasks(args.chapter, args.root)
            print(f"Created {_show(target)}: a copy of {target.name} with {len(tasks)} task(s) stubbed out.\n"
                  "Write these functions (look for '# BEGIN SOLUTION <task>'):")
            width = max([len(t) for t in tasks] + [4])
            for task, regions in tasks.items():
                for r in regions:
                    file = target / Path(*r.file.parts[1:])
                    worth = f"{r.points} pt" + ("s" if r.points > 1 else "")
                    print(f"  {task:<{width}}  {worth:>6}  {_show(file)}:{r.begin:<5} {r.function}")
            print(f"Then grade your copy: python -m course homework check {args.chapter}")
            return 0
        if args.command == "release":
            from .release import release

            target = release(args.dest, args.chapters, force=args.force)
            print(f"Wrote the student release {_show(target)}")
            return 0
        fmt = args.format or ("json" if args.json else "table")
        tasks = args.task or (list(find_tasks(args.chapter, args.root)) if args.scored_only else None)
        result = check(args.chapter, args.dest, args.timeout, args.extra_tests, tasks, args.root,
                       total_timeout=args.total_timeout, verbose=args.verbose)
    except FileExistsError as exc:
        print(f"homework {args.command}: {exc}", file=sys.stderr)
        return 2
    except (CheckError, MarkerError) as exc:
        print(f"homework {args.command}: {exc}", file=sys.stderr)
        if args.command == "check" and (args.format == "gradescope"):
            _emit(gradescope(_unrunnable(args.chapter, f"the check could not run: {exc}", args.root)), args.output)
        return 2
    if fmt == "table":
        _print_report(result, args.chapter)
    else:
        _emit(gradescope(result) if fmt == "gradescope" else result, args.output)
    return 0


def _emit(obj: dict, output: Path | None) -> None:
    """One JSON object: to `output`, or as the last line of stdout."""
    text = json.dumps(obj)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
        print(f"wrote {_show(output)}")
    else:
        print(text)
