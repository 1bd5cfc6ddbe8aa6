"""The pytest runner of `homework check`: worker processes that run a chapter's tests against a student copy,
and the grader's side of them, which takes nothing the student's code could have written on trust.

Inside a worker, a run imports the chapter package from the copy (and only that package: other chapters still
come from the reference, unless the run says they are built on the student's own copies), checks where it came
from, then runs pytest in the same interpreter with a per-test timeout (pytest-timeout's SIGALRM) and a small
reporter plugin. One worker can run many checks, so torch is imported once; that is what keeps the suite-wide
proof (tests/test_homework_proof.py) fast.

The student's code runs in that process, so the grader (`run_workers`, in the calling process) guards itself:

- the channel: a worker reads its instructions, an HMAC key and the number of its report pipe from stdin, before
  it imports any student code. Every event goes down that pipe with a sequence number and its HMAC; a line that
  fails either is tampering. There is no report file, and nothing in argv or the environment names one;
- the tests run from the grader's private copy (integrity.py), each module ending with two canaries: one must
  pass, one must fail. A test's pass counts only once both canaries of its module, run after it in the same
  process, did as they must: a runner patched to pass everything (or a test body swapped for a no-op) passes
  the failing canary, which is tampering, and so is a canary missing from a run that reached its end;
- the grader computes every outcome from the raw reports of each phase: a skip or an xfail raised through the
  student's code counts as a failure (a test's own skipif marks and skips stay skips);
- time: a test that has not finished within its timeout plus a grace is killed from outside with its whole
  process tree (no need for the student's code to honour SIGALRM); it fails, and a new worker runs the tests
  whose results the dead one could not vouch for (those of a task that already failed are not run again).
  A test that kills its process fails the same way. The whole check has a wall-clock limit too;
- every worker leads a session of its own; whenever one ends, every process of that session, every descendant
  and every orphan handed to the grader as subreaper is killed (procs.py), before anything is reported.

Grading the results is grading.py's job.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib
import importlib.util
import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import pytest

from ..paths import REPO_ROOT, shown
from . import procs, trace


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
    built_on: list[str] = field(default_factory=list)  # earlier chapters imported from their copies in `dest`
    notes: list[str] = field(default_factory=list)  # said in the report (e.g. an earlier chapter left stubbed)
    points: dict[str, int] = field(default_factory=dict)  # task -> points, read before any student code ran
    trace: bool = False  # record which tasks' bodies each test runs (trace.py; the proof's reference runs)


@dataclass
class Job:
    """A Run as a worker gets it: where the grader's private copy of its tests is, and their canaries."""

    run: Run
    root: str  # the private copy: pytest's rootdir
    tests: list[str]  # the run's test folders inside it
    config: str  # the grader's copy of the pytest config
    canaries: dict[str, str]  # nodeid -> "pass" | "fail"
    secret: str  # what the failing canaries raise
    expected: dict[str, list[str]] = field(default_factory=dict)  # "module::test" -> tasks: must be collected


@dataclass
class Ended:
    """What a run left, as the grader verified it."""

    tests: dict[str, list[str]] = field(default_factory=dict)  # collected test -> its tasks
    tags: list[str] = field(default_factory=list)  # every task tag seen before selecting (typos show up)
    results: dict[str, tuple[str, str, bool]] = field(default_factory=dict)  # test -> outcome, message, timed out
    frames: dict[str, list] = field(default_factory=dict)  # failing test -> [file, line] of the copy it raised in
    ran: dict[str, list[str]] = field(default_factory=dict)  # test -> the tasks whose bodies it ran (Run.trace)
    collect_errors: list[dict] = field(default_factory=list)
    error: str | None = None  # the copy did not import, or the run stopped early
    fatal: str | None = None  # not graded against the copy: the check cannot say anything
    exit_code: int | None = None
    seconds: float | None = None
    tampering: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    output: str = ""


# ---------------------------------------------------------------- inside a worker process


class _Channel:
    """The worker's end of its report pipe: one line per event, `hmac-hex json`, numbered."""

    __slots__ = ("_fd", "_mac", "_seq")

    def __init__(self, fd: int, key: bytes) -> None:
        self._fd, self._mac, self._seq = fd, hmac.new(key, digestmod=hashlib.sha256), 0

    def send(self, event: str, **data: object) -> None:
        body = json.dumps({"seq": self._seq, "event": event, **data}, separators=(",", ":")).encode()
        mac = self._mac.copy()
        mac.update(body)
        line = mac.hexdigest().encode() + b" " + body + b"\n"
        while line:
            line = line[os.write(self._fd, line):]
        self._seq += 1


def _task_ids(item: pytest.Item) -> list[str]:
    return [m.args[0] for m in item.iter_markers("task") if m.args]


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


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
    """pytest plugin: selects tests by task, puts each module's canaries after its last test, re-checks the
    chapter's origin, and sends the raw report of every phase (the grader decides what it means)."""

    __slots__ = ("send", "job", "exclude", "copy", "dest", "tags", "modules")

    def __init__(self, channel: _Channel, job: Job, exclude: set[str]) -> None:
        self.send, self.job, self.exclude = channel.send, job, exclude
        self.copy = (Path(job.run.dest) / job.run.package).resolve()
        self.dest = Path(job.run.dest).resolve()
        self.tags: list[str] = []
        self.modules: list[str] = []  # test modules that collected

    def pytest_configure(self, config: pytest.Config) -> None:
        config.addinivalue_line("markers", "task(id): the homework task this test grades")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        exclude, canaries = self.exclude, self.job.canaries
        graded = [item for item in items if item.nodeid not in canaries]
        self.tags = sorted({t for item in graded for t in _task_ids(item)})  # before selecting: typos show up
        wanted = None if self.job.run.tasks is None else set(self.job.run.tasks)
        keep = [item for item in graded if item.nodeid not in exclude
                and (wanted is None or wanted & set(_task_ids(item)))]
        ends = {_module(item.nodeid): i for i, item in enumerate(keep, 1)}
        for module, end in sorted(ends.items(), key=lambda kv: -kv[1]):  # the passing canary first
            mine = [item for item in items if item.nodeid in canaries and _module(item.nodeid) == module]
            keep[end:end] = sorted(mine, key=lambda item: canaries[item.nodeid] != "pass")
        kept = {id(item) for item in keep}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
        items[:] = keep

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.passed and "::" not in report.nodeid and report.nodeid.endswith(".py"):
            self.modules.append(report.nodeid)
        if report.failed:
            self.send("collect_error", nodeid=report.nodeid, message=_message(report))
        elif report.skipped and isinstance(report.longrepr, tuple) and self._student(report.longrepr[0]):
            self.send("collect_error", nodeid=report.nodeid,
                      message=f"a skip raised from your code while collecting: {_message(report)}")

    def _student(self, filename: str) -> bool:
        return Path(filename).resolve().is_relative_to(self.dest)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        run = self.job.run
        if bad := _foreign(run.package, self.copy):  # a test or conftest re-imported the reference
            self.send("fatal", message=f"not graded against the copy {self.copy}: {'; '.join(bad)}")
            pytest.exit("chapter not imported from the student copy", returncode=3)
        canaries = self.job.canaries
        self.send("collected", tags=self.tags, modules=self.modules,
                  canaries=[i.nodeid for i in session.items if i.nodeid in canaries],
                  tests=[{"nodeid": i.nodeid, "tasks": _task_ids(i)} for i in session.items
                         if i.nodeid not in canaries])

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self.job.run.trace:
            trace.take()  # what ran before this test (collection, an earlier test's teardown) is not its own
        self.send("start", nodeid=nodeid)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
        report = yield
        student, frames = False, []
        if call.excinfo is not None:
            stack = [(Path(f.filename).resolve(), f.lineno) for f in _raised_through(call.excinfo.value)]
            if report.skipped or hasattr(report, "wasxfail"):  # a skip or xfail that the student's code raised
                student = call.excinfo.errisinstance((pytest.skip.Exception, pytest.xfail.Exception)) and any(
                    path.is_relative_to(self.dest) for path, _ in stack)
            if report.failed:  # where in the copy the exception went through: which body of a task failed
                frames = [(str(path.relative_to(self.dest)), line) for path, line in stack
                          if path.is_relative_to(self.copy) and line]
        self.send("phase", nodeid=item.nodeid, when=call.when, outcome=report.outcome,
                  xfail=hasattr(report, "wasxfail"), student=student,
                  message="" if report.passed else _message(report), frames=frames)
        if item.nodeid in self.job.canaries and call.when == "call" and report.failed:  # sent: --verbose shows no
            report.outcome, report.longrepr = "passed", None  # failure the student cannot act on
        return report

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if self.job.run.trace:
            self.send("finish", nodeid=nodeid, ran=sorted(trace.take()))
        else:
            self.send("finish", nodeid=nodeid)


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


def _raised_through(exc: BaseException | None) -> list[traceback.FrameSummary]:
    """The frames an exception went through, with those of the exceptions it was raised from (`raise ... from`):
    Triton's interpreter raises its own error from the one a kernel's body raised, a level per nested call."""
    frames: list[traceback.FrameSummary] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        frames += traceback.extract_tb(exc.__traceback__)
        exc = exc.__cause__
    return frames


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


def _run_in_process(job: Job, exclude: set[str], channel: _Channel) -> None:
    run = job.run
    reporter, saved = _Reporter(channel, job, exclude), sys.path[:]
    dirs = [Path(run.dest), Path(run.rootdir), REPO_ROOT, Path(job.root), *map(Path, run.tests)]
    channel.send("begin")
    _forget_project_modules(dirs)
    importlib.invalidate_caches()
    code = None
    finder = trace.install([Path(run.dest), Path(run.rootdir)]) if run.trace else None
    try:
        for package in [*run.built_on, run.package]:
            copy = (Path(run.dest) / package).resolve()
            try:
                with _time_limit(run.import_timeout):
                    _import_copy(package, copy)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 (a pytest.skip or SystemExit at import time too)
                what = "" if package == run.package else f"your copy of {package}, which {run.package} builds on:\n"
                channel.send("import_error", message=what + _import_error(exc, copy))
                return
        if bad := _foreign(run.package, reporter.copy):
            channel.send("fatal", message=f"imported {'; '.join(bad)}, not the copy {reporter.copy}")
            return
        channel.send("imported")
        # signal method: a looping test gets an exception and fails alone (the thread method ends the run).
        # Tracebacks as Python prints them: pytest's own re-reads the source of every frame, a quarter of a second
        # per failing test through the frames of Triton's interpreter (chapter 6), for the same lines.
        args = [*job.tests, "-c", job.config, "--rootdir", job.root, "--confcutdir", job.root,
                "-p", "no:cacheprovider", "-p", "no:nbmake", "-q", "--tb=native", "--continue-on-collection-errors",
                f"--timeout={run.timeout:g}", "--timeout-method=signal"]
        code = int(pytest.main(args, plugins=[reporter]))
    finally:
        sys.path[:] = saved
        if finder is not None:
            trace.uninstall(finder)
        _forget_project_modules(dirs)
        channel.send("done", exit_code=code)


def _worker() -> None:
    """Entry point of a worker process. Its instructions, the key of its report pipe and that pipe's number come
    on stdin, read to the end before any student code is imported; then each job runs in turn."""
    raw = sys.stdin.buffer.read()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    spec = json.loads(raw)
    del raw
    channel = _Channel(spec.pop("fd"), bytes.fromhex(spec.pop("key")))
    channel.send("hello", pid=os.getpid())
    for fields, exclude in spec.pop("jobs"):
        job = Job(**{**fields, "run": Run(**fields["run"])})
        _run_in_process(job, set(exclude), channel)
        sys.stdout.flush()
    channel.send("bye")


# ---------------------------------------------------------------- in the calling process: the grader


class _Tampered(Exception):
    """What the grader saw cannot come from an honest run."""


def _grace(timeout: float) -> float:
    """How long past a test's timeout the grader waits before it kills the worker (SIGALRM did not stop it)."""
    return max(2.0, 0.1 * timeout)


def _verdict(phases: list[dict]) -> tuple[str, str, bool, list]:
    """A test's outcome from the reports of its phases: (outcome, message, timed out, frames)."""
    outcome, message, frames = "passed", "", []
    for p in phases:
        failed = p["outcome"] == "failed" or p["student"]
        text = p["message"]
        if p["student"]:
            text = f"{'an xfail' if p['xfail'] else 'a skip'} raised from your code counts as a failure: {text}"
        if failed:
            frames += p["frames"]
            if outcome in ("passed", "skipped"):
                outcome, message = ("failed" if p["when"] == "call" else "error"), text
        elif p["outcome"] == "skipped" and not p["xfail"] and outcome == "passed":
            outcome, message = "skipped", text
    return outcome, message, "Timeout" in message and "pytest-timeout" in message, frames


class _Progress:
    """The grader's view of one run, over every worker session that ran part of it."""

    def __init__(self, job: Job, ended: Ended) -> None:
        self.job, self.ended = job, ended
        self.graded: dict[str, list[str]] | None = None  # from the first session: test -> tasks
        self.verified: dict[str, tuple] = {}  # test -> (outcome, message, timed out, frames): final
        self.culprits: dict[str, tuple] = {}  # tests that hung or killed their worker: (outcome, message, timed out)
        self.finished = False
        self.elapsed = 0.0
        self.session()

    def session(self) -> None:
        """Forget what an unfinished session left: a new worker runs its tests again."""
        self.stage, self.running, self.began = "waiting", None, None
        self.phases: dict[str, list[dict]] = {}
        self.pending: dict[str, list[tuple[str, tuple]]] = {}  # module -> its passes, waiting for its canaries
        self.vouched: dict[str, set[str]] = {}  # module -> the kinds of its canaries that did as they must
        self.expected: set[str] = set()  # the canaries this session kept
        self.seen: set[str] = set()  # the canaries that ran

    def exclude(self) -> list[str]:
        """Tests a new session does not run: those with a result, the culprits, and those of failed tasks only."""
        graded = self.graded or {}
        lost = {t for nodeid, r in [*self.verified.items(), *self.culprits.items()] if r[0] in ("failed", "error")
                for t in graded.get(nodeid, [])} & set(self.job.run.points)
        moot = {nodeid for nodeid, tasks in graded.items() if tasks and set(tasks) <= lost}
        return sorted(self.verified.keys() | self.culprits.keys() | moot)

    def left(self) -> bool:
        """Whether a new session would run any test."""
        return self.graded is None or bool(self.graded.keys() - set(self.exclude()))

    # -------------------------------------------------------- the worker's events

    def on(self, e: dict) -> None:
        kind = e["event"]
        if kind == "begin":
            self.stage, self.began = "import", time.monotonic()
        elif kind == "import_error":
            self.ended.error = f"the copy does not import:\n{e['message']}"
        elif kind == "fatal":
            self.ended.fatal = e["message"]
        elif kind == "imported":
            self.stage = "collect"
        elif kind == "collect_error":
            if all(c["nodeid"] != e["nodeid"] for c in self.ended.collect_errors):
                self.ended.collect_errors.append({"nodeid": e["nodeid"], "message": e["message"]})
        elif kind == "collected":
            self._collected(e)
        elif kind == "start":
            self.running = e["nodeid"]
            self.phases[e["nodeid"]] = []
        elif kind == "phase":
            self.phases.setdefault(e["nodeid"], []).append(e)
        elif kind == "finish":
            if "ran" in e:
                self.ended.ran[e["nodeid"]] = list(e["ran"])
            self._finished(e["nodeid"])
        elif kind == "done":
            self._done(e["exit_code"])
        else:
            raise _Tampered(f"an unknown event {kind!r} on the report channel")

    def _collected(self, e: dict) -> None:
        tests = {t["nodeid"]: t["tasks"] for t in e["tests"]}
        if self.graded is None:
            self.graded, self.ended.tags = tests, e["tags"]
            wanted = None if self.job.run.tasks is None else set(self.job.run.tasks)
            missing = [name for name, tasks in self.job.expected.items()
                       if _module(name) in e["modules"] and (wanted is None or wanted & set(tasks))
                       and not any(n == name or n.startswith(f"{name}[") for n in tests)]
            if missing:
                raise _Tampered(f"tests of the instructor's were not collected: {', '.join(missing[:5])}")
        elif tests.keys() - self.graded.keys():
            new = sorted(tests.keys() - self.graded.keys())
            raise _Tampered(f"a new worker collected tests the first did not: {new}")
        self.expected = set(e["canaries"])
        for module in {_module(n) for n in tests}:
            if not {n for n in self.job.canaries if _module(n) == module} <= self.expected:
                raise _Tampered(f"the grader's canary tests of {module} were not collected, or were deselected")
        self.stage = "tests"

    def _finished(self, nodeid: str) -> None:
        phases = self.phases.pop(nodeid, [])
        self.running = None
        if nodeid in self.job.canaries:
            self._canary(nodeid, phases)
        elif self.graded is None or nodeid not in self.graded:
            raise _Tampered(f"a result for {nodeid}, which was not collected")
        elif (result := _verdict(phases))[0] == "passed":  # counts once its module's canaries vouch for this run
            self.pending.setdefault(_module(nodeid), []).append((nodeid, result))
        else:
            self.verified[nodeid] = result

    def _canary(self, nodeid: str, phases: list[dict]) -> None:
        kind, module = self.job.canaries[nodeid], _module(nodeid)
        self.seen.add(nodeid)
        by = {p["when"]: p for p in phases}
        if "setup" in by and by["setup"]["outcome"] != "passed" and not by["setup"]["student"]:
            return  # a fixture of the module failed or skipped it: it vouches for nothing, and accuses no one
        call = by.get("call")
        if kind == "fail":
            ok = call is not None and call["outcome"] == "failed" and self.job.secret in call["message"]
        else:
            ok = call is not None and call["outcome"] == "passed" and not call["student"]
        if not ok:
            did = "did not run" if call is None else call["outcome"]
            raise _Tampered(f"the grader's canary test that must {kind} {did} ({module}): the test runner was "
                            "tampered with")
        self.vouched.setdefault(module, set()).add(kind)
        if self.vouched[module] == {"pass", "fail"}:
            for test, result in self.pending.pop(module, []):
                self.verified[test] = result

    def _done(self, code: int | None) -> None:
        """The job ended in the worker; a pytest run that reached its end ran every canary it kept."""
        if code in (0, 1):
            if missing := self.expected - self.seen:
                raise _Tampered(f"the grader's canary tests did not run: {sorted(missing)}")
            if any(self.pending.values()):
                raise _Tampered("tests passed after the canaries of their module had run: "
                                f"{sorted(n for p in self.pending.values() for n, _ in p)}")
        self.end(f"pytest stopped early (exit code {code})", blame=True)

    # -------------------------------------------------------- how it ends

    def end(self, why: str, blame: bool = False) -> None:
        """The run is over: tests without a verified result failed (the running one, when `blame`), were not
        counted (passes its canaries did not vouch for) or did not run."""
        if self.finished:
            return
        if self.began is not None:
            self.elapsed += time.monotonic() - self.began
        unvouched = {nodeid for p in self.pending.values() for nodeid, _ in p}
        moot = set(self.exclude()) - self.verified.keys() - self.culprits.keys() if self.culprits else set()
        for nodeid in self.graded or {}:
            if nodeid in self.verified:
                *result, self.ended.frames[nodeid] = self.verified[nodeid]
                self.ended.results[nodeid] = tuple(result)
            elif nodeid in self.culprits:
                self.ended.results[nodeid] = self.culprits[nodeid]
            elif blame and nodeid == self.running:
                self.ended.results[nodeid] = ("failed", why, False)
            elif nodeid in unvouched:
                self.ended.results[nodeid] = ("error", f"not counted: {why} before the grader could check the run "
                                                       "of its module", False)
            elif nodeid in moot:
                stopped = ", ".join(n.split("::")[-1] for n in self.culprits)
                self.ended.results[nodeid] = ("error", f"not run: its task had already failed when {stopped} "
                                                       "stopped the test process", False)
            else:
                self.ended.results[nodeid] = ("error", f"not run: {why}", False)
        self.ended.tests = dict(self.graded or {})
        self.ended.seconds = round(self.elapsed, 2)
        self.finished = True

    def lost(self, why: str, timed_out: bool) -> bool:
        """Its worker died or was killed; True when a new worker should go on with the run."""
        if self.stage == "tests" and self.running is not None:
            self.culprits[self.running] = ("failed", why, timed_out)
            self.ended.notes.append(f"{self.running}: {why}; a new test process ran the tests after it")
            if self.began is not None:
                self.elapsed += time.monotonic() - self.began
            self.session()
            if self.left():
                return True
            self.end(why)
            return False
        self.ended.error = f"stopped: {why}"
        self.end(why)
        return False


class _Slot:
    """One worker at a time for a queue of runs; when it is lost, a new worker takes over the queue."""

    def __init__(self, queue: list[_Progress], env: dict, scratch: Path, log: TextIO | None,
                 selector: selectors.BaseSelector) -> None:
        self.queue, self.env, self.scratch, self.log, self.selector = queue, env, scratch, log, selector
        self.proc: subprocess.Popen | None = None
        self.current: _Progress | None = None
        self.pids: list[int] = []  # every worker it started: their sessions are swept at the end

    def start(self) -> None:
        self.key, self.seq, self.buffer, self.began = secrets.token_bytes(32), 0, b"", False
        read, write = os.pipe()
        jobs = [(asdict(p.job), p.exclude()) for p in self.queue]
        spec = json.dumps({"fd": write, "key": self.key.hex(), "jobs": jobs}).encode()
        cmd = [sys.executable, "-c", f"from {__name__} import _worker; _worker()"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=self.scratch, env=self.env, pass_fds=(write,), start_new_session=True)
        self.pids.append(self.proc.pid)
        os.close(write)
        self.read = read
        os.set_blocking(read, False)
        self.selector.register(read, selectors.EVENT_READ, self)
        self.deadline = time.monotonic() + self._limit("import")
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(spec)
            self.proc.stdin.close()

    @property
    def live(self) -> bool:
        return self.proc is not None and self.read in self.selector.get_map()

    def _limit(self, stage: str) -> float:
        """How long the worker may stay silent now."""
        progress = self.current or (self.queue[0] if self.queue else None)
        if progress is None:
            return 60.0
        run = progress.job.run
        if stage in ("import", "collect", "waiting"):
            return run.import_timeout + _grace(run.import_timeout)
        return run.timeout + _grace(run.timeout) if run.timeout > 0 else float("inf")

    def feed(self, data: bytes) -> None:
        """Events from the pipe; raises _Tampered for a line the worker did not write in that order."""
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            mac, _, body = line.partition(b" ")
            if not hmac.compare_digest(mac, hmac.new(self.key, body, hashlib.sha256).hexdigest().encode()):
                raise _Tampered("a line on the report channel that the grader's worker did not write")
            e = json.loads(body)
            if e.get("seq") != self.seq:
                raise _Tampered(f"event {e.get('seq')} on the report channel where {self.seq} was due (replayed?)")
            self.seq += 1
            self._event(e)

    def _event(self, e: dict) -> None:
        kind, now = e["event"], time.monotonic()
        if kind in ("hello", "bye"):
            if kind == "hello" and e["pid"] != self.proc.pid:
                raise _Tampered("the worker's greeting came from another process")
            return
        if kind == "begin":
            if not self.queue or self.current is not None:
                raise _Tampered("a run began that the grader did not hand out")
            self.current, self.began = self.queue.pop(0), True
        elif self.current is None:
            raise _Tampered(f"a {kind!r} event outside any run")
        current = self.current
        current.on(e)
        if kind != "phase":  # a test has its whole limit from its start
            self.deadline = now + self._limit(current.stage)
        if current.finished:
            self.current = None

    def halt(self, why: str | None = None, timed_out: bool = False, over: bool = False) -> int:
        """Kill the worker's session, descendants and orphans; its run goes to a new worker when it can (`why`:
        what happened, None: the worker ended by itself; `over`: the check's time is up). Returns how many
        processes other than the worker were killed."""
        assert self.proc is not None
        self.selector.unregister(self.read)
        os.close(self.read)
        killed = procs.sweep([self.proc.pid], keep=procs.children() - {self.proc.pid}, unreaped=[self.proc.pid])
        code = self.proc.wait()
        ended = why is None
        if why is None:
            why = (f"the test process died (exit code {code})" if code >= 0 else
                   f"the test process was killed by signal {-code}")
        current, self.current = self.current, None
        if current is not None and over:
            current.ended.error = f"stopped: {why}"
            current.end(why, blame=True)
        elif current is not None and current.lost(why, timed_out):
            self.queue.insert(0, current)
        elif current is None and self.queue and not self.began and ended:  # it died before its first run
            first = self.queue.pop(0)
            first.ended.error = f"stopped: {why} before it began"
            first.end(why)
        return killed

    def tampered(self, why: str) -> int:
        """Tampering in the current run (or in the run due next): it ends with it, and its worker is killed."""
        current = self.current or (self.queue.pop(0) if self.queue else None)
        self.current = None
        killed = self.halt("tampering")
        if current is not None:
            current.ended.tampering.append(why)
            current.session()
            current.end("the check found tampering")
        return killed

    def overdue(self) -> int:
        """The worker was silent for longer than it may be: kill it."""
        current = self.current
        if current is not None and current.stage == "tests" and current.running is not None:
            limit = current.job.run.timeout
            return self.halt(f"Timeout: still running {limit + _grace(limit):g}s after it started (its limit is "
                             f"{limit:g}s): the grader killed its process, where SIGALRM did not stop it",
                             timed_out=True)
        doing = {"collect": "collecting the tests", "tests": "between tests"}.get(current.stage if current else "",
                                                                                  "importing")
        return self.halt(f"the test process hung {doing}, past its time limit, and was killed")


def run_workers(jobs: list[Job], scratch: Path, total_timeout: float = 1800.0, workers: int = 1,
                verbose: bool = False) -> list[Ended]:
    """Run `jobs` in `workers` worker processes (each imports torch once); what each run left, in order.
    `scratch`: a folder of the grader's, for the workers' logs and working directory."""
    ended = [Ended() for _ in jobs]
    progress = [_Progress(job, e) for job, e in zip(jobs, ended, strict=True)]
    if not jobs:
        return ended
    paths = dict.fromkeys([j.run.rootdir for j in jobs] + [str(REPO_ROOT)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=os.pathsep.join(paths), PYTHONDONTWRITEBYTECODE="1")
    count = min(workers, len(jobs))
    selector = selectors.DefaultSelector()
    logs = [None if verbose else open(scratch / f"worker{w}.log", "w+") for w in range(count)]  # noqa: SIM115
    slots = [_Slot(progress[w::count], env, scratch, logs[w], selector) for w in range(count)]
    baseline = procs.children()
    deadline = time.monotonic() + total_timeout
    over = f"the whole check ran past its time limit ({total_timeout:g}s)"
    killed = 0
    try:
        with procs.subreaper():
            for slot in slots:
                slot.start()
            while live := [s for s in slots if s.live]:
                now = time.monotonic()
                if now >= deadline:
                    for slot in live:
                        killed += slot.halt(over, over=True)
                    break
                wait = min([deadline, *(s.deadline for s in live)]) - now
                for key, _ in selector.select(timeout=max(0.0, min(wait, 1.0))):
                    slot = key.data
                    try:
                        data = os.read(slot.read, 1 << 16)
                        if data:
                            slot.feed(data)
                            continue
                        killed += slot.halt()  # the pipe closed: the worker ended
                    except BlockingIOError:
                        continue
                    except (_Tampered, ValueError, KeyError, TypeError) as exc:  # ValueError: not JSON
                        killed += slot.tampered(str(exc) if isinstance(exc, _Tampered) else
                                                f"a malformed event on the report channel ({exc!r})")
                    if slot.queue:
                        slot.start()
                now = time.monotonic()
                for slot in [s for s in slots if s.live and s.deadline <= now]:
                    killed += slot.overdue()
                    if slot.queue:
                        slot.start()
    finally:
        for slot in slots:
            if slot.live:
                killed += slot.halt(over, over=True)
        killed += procs.sweep([pid for slot in slots for pid in slot.pids], keep=baseline)
        selector.close()
    output = []
    for log in logs:
        if log:
            log.seek(0)
            output.append(log.read()[-3000:])
            log.close()
    for p in progress:  # never begun: the time ran out first
        if not p.finished:
            p.ended.error = p.ended.error or f"stopped: {over}"
            p.end(over)
        p.ended.output = "\n".join(output)
        if killed:
            p.ended.notes.append(f"the grader killed {killed} process(es) that the tests had left running")
        if p.ended.error and "died" in p.ended.error:
            p.ended.error += f"; its output ended with:\n{p.ended.output[-1000:]}"
    return ended
