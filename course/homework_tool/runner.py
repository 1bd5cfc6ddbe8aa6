"""The pytest runner of `homework check`: worker processes that run a chapter's tests against a student copy.

A worker imports the chapter package from the copy (and only that package: other chapters still come from the
reference, unless the run says they are built on the student's own copies), checks where it came from, then
runs pytest in the same interpreter with a per-test timeout and a small reporter plugin that writes one JSON
line per event. One worker can run many checks, so torch is imported once; that is what keeps the suite-wide
proof (tests/test_homework_proof.py) fast. Grading those events is course/homework_tool/grading.py's job.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
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

from ..paths import REPO_ROOT, shown


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


class Ended(NamedTuple):
    """What a run left behind: its JSON-lines events, why its worker ended early (if it did), the workers' output."""

    events: str
    stopped: str | None
    output: str


# ---------------------------------------------------------------- inside a worker process


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
        self.frames: dict[str, list[tuple[str, int]]] = {}  # nodeid -> (file, line) in the copy its exception crossed
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

    def pytest_exception_interact(self, node: pytest.Item | pytest.Collector, call: pytest.CallInfo) -> None:
        """A test failed with an exception: keep the lines of the copy its traceback went through (file
        relative to the homework folder), so that grading can say which body of a task it failed in."""
        if call.excinfo is None:
            return
        dest = Path(self.run.dest).resolve()
        frames = self.frames.setdefault(node.nodeid, [])
        for frame in traceback.extract_tb(call.excinfo.tb):
            path = Path(frame.filename).resolve()
            if path.is_relative_to(self.copy) and frame.lineno:
                frames.append((str(path.relative_to(dest)), frame.lineno))

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        outcome, message = self.outcomes.pop(nodeid, ("passed", ""))
        self.emit("result", nodeid=nodeid, outcome=outcome, message=message,
                  timeout="Timeout" in message and "pytest-timeout" in message,
                  frames=self.frames.pop(nodeid, []) if outcome in ("failed", "error") else [])


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
    where = f"  {shown(Path(frames[-1].filename))}:{frames[-1].lineno}, in {frames[-1].name}\n" if frames else ""
    what = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    return f"{where}  {what.replace(chr(10), chr(10) + '  ')}"


def _forget_project_modules(dirs: Iterable[Path]) -> None:
    """Drop modules loaded from the course (not from the venv) so the next run imports them afresh."""
    venv = Path(sys.prefix).resolve()
    roots = [d.resolve() for d in dirs]
    for name, module in list(sys.modules.items()):
        if name in ("course", __package__) or name.startswith(f"{__package__}."):  # the tool itself stays
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


# ---------------------------------------------------------------- in the calling process


def run_workers(runs: list[Run], total_timeout: float = 1800.0, workers: int = 1, verbose: bool = False
                ) -> list[Ended]:
    """Run `runs` in `workers` worker processes (each imports torch once); what each run left, in order."""
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
            cmd = [sys.executable, "-c", f"import sys; from {__name__} import _worker; _worker(sys.argv[1])",
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
        return [Ended(Path(run.report).read_text(), stopped.get(i % len(procs)), "\n".join(tails))
                for i, run in enumerate(runs)]
