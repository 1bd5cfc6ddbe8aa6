"""`homework check` awards only earned points: submissions that try to get task2.allocate_free's 2 points without
the work, each checked the way an autograder does (a student release with chapter 2 handed out, the release's
own `python -m course homework check step02 --task task2.allocate_free --json`), score 0 or are flagged as
tampering; the reference body still scores 2/2, so these tests cannot pass by scoring everything 0.

Each submission is a known way to cheat a grader that runs student code in its own process (patching pytest,
rewriting the report or the tests, skipping, outliving the limit); they run two at a time in one module fixture.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from course import homework_tool as hw
from course.paths import REPO_ROOT

TASK = "task2.allocate_free"
STUB = f'raise NotImplementedError("{TASK}: see step02_paged/README.md#exercises")'
# The homework copy is <release>/<dest>/step02_paged/block_manager.py: the release's root is two folders up.
ROOT = "__import__('pathlib').Path(__file__).resolve().parents[2]"


@dataclass
class Row:
    """A submission: code at the end of block_manager.py (`module`) and/or in place of the task's two stubs."""

    module: str = ""
    allocate: str | None = None
    release: str | None = None
    honest: bool = False  # start from the reference bodies
    args: tuple[str, ...] = ()
    own_release: bool = False  # it changes the release itself: give it a copy of its own


ONCE = "global _DONE\nif not globals().get('_DONE'):\n    _DONE = True\n"

ROWS = {  # the loop first: it mostly waits, while the others work
    # a body that ignores SIGALRM (pytest-timeout's signal) and loops
    "loop": Row(args=("--timeout", "2"), allocate=textwrap.dedent("""\
        import signal, time
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        while True:
            time.sleep(0.05)
        """), release="return []\n"),
    "honest": Row(honest=True),
    # module-level: every test "runs" and passes without calling anything
    "runtest": Row(module="import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n"),
    # a body finds the grader's reporter through gc and rewrites every outcome it reports to passed
    "gc_reporter": Row(allocate=ONCE + textwrap.indent(textwrap.dedent("""\
        import gc
        for o in gc.get_objects():
            if not (getattr(type(o), "__module__", "") or "").endswith("homework_tool.runner"):
                continue
            for name in ("send", "emit"):
                f = getattr(o, name, None)
                if not callable(f):
                    continue
                def lie(event, *args, _f=f, **data):
                    if "outcome" in data:
                        data.update(outcome="passed", message="", student=False)
                    return _f(event, *args, **data)
                try:
                    setattr(o, name, lie)
                except AttributeError:
                    pass
                for key in list(getattr(o, "outcomes", {}) or {}):
                    o.outcomes[key] = ("passed", "")
        """), "    ") + "return []\n", release="return []\n"),
    # skips do not count: skip every test that would fail
    "skip": Row(allocate="import pytest\npytest.skip('not today')\n", release="import pytest\npytest.skip('no')\n"),
    # a body swaps every collected test's function for a no-op, and skips the test it runs in
    "noop_tests": Row(allocate=textwrap.dedent("""\
        import gc
        import pytest
        import _pytest.python
        for o in gc.get_objects():
            if isinstance(o, _pytest.python.Function):
                o.obj = lambda *args, **kwargs: None
        pytest.skip("swapped")
        """), release="return []\n"),
    # a body appends fake "passed" events to every report it can find (the old one was named in sys.argv[1]),
    # then ends the process before anything else is reported
    "fake_report": Row(allocate=textwrap.dedent("""\
        import gc, json, os, sys
        import _pytest.python
        ids = [o.nodeid for o in gc.get_objects() if isinstance(o, _pytest.python.Function)]
        lines = [json.dumps({"event": "result", "nodeid": n, "outcome": "passed", "message": "", "timeout": False,
                             "frames": []}) for n in ids]
        lines.append(json.dumps({"event": "done", "exit_code": 0, "seconds": 1.0}))
        text = ("\\n".join(lines) + "\\n").encode()
        try:
            for run in json.load(open(sys.argv[1])):
                with open(run["report"], "ab") as out:
                    out.write(text)
        except Exception:
            pass
        for fd in range(3, 256):
            try:
                os.write(fd, text)
            except OSError:
                pass
        os._exit(0)
        """), release="return []\n"),
    # module-level: rewrite the chapter's tests before they are collected (every test of the task passes)
    "rewrite_tests": Row(own_release=True, module=textwrap.dedent(f"""\
        _tests = {ROOT} / "tests" / "step02" / "test_block_manager.py"
        _tests.write_text("import pytest\\n" + "".join(
            f"\\n\\n@pytest.mark.task('{TASK}')\\ndef test_{{name}}():\\n    pass\\n" for name in
            ("allocate_then_release_returns_blocks", "shared_block_is_freed_by_its_last_holder",
             "over_allocation_raises_and_changes_nothing", "double_free_raises_and_changes_nothing")))
        """)),
    # module-level, on top of the real work: the task is worth 500 points, as the markers say after the run
    "points": Row(own_release=True, honest=True, module=textwrap.dedent(f"""\
        _source = {ROOT} / "step02_paged" / "block_manager.py"
        _source.write_text(_source.read_text().replace("points=2", "points=500"))
        """)),
    # on top of the real work, a detached process (its own session, its parent gone) rewrites the results file
    # once the check has written it
    "detached": Row(honest=True, allocate=ONCE + textwrap.indent(textwrap.dedent("""\
        import os, subprocess, sys
        code = (
            "import json, os, sys, time\\n"
            "if os.fork():\\n    os._exit(0)\\n"
            "os.setsid()\\n"
            "open(sys.argv[2], 'w').write(str(os.getpid()))\\n"
            "while True:\\n"
            "    time.sleep(0.02)\\n"
            "    try:\\n"
            "        if json.load(open(sys.argv[1]))['score'] != 1000:\\n"
            "            open(sys.argv[1], 'w').write(json.dumps({'score': 1000, 'tests': []}))\\n"
            "    except (OSError, ValueError):\\n"
            "        pass\\n")
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.Popen([sys.executable, "-c", code, os.path.join(here, "..", "results.json"),
                          os.path.join(here, "..", "daemon.pid")], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        """), "    ")),
    # not in the table: the reference bodies with release() made lenient (a double free returns []), and the
    # test that catches it dropped while the module is collected
    "drop_tests": Row(honest=True, module=textwrap.dedent("""\
        _release = BlockManager.release


        def _lenient(self, blocks):
            try:
                return _release(self, blocks)
            except ValueError:
                return []


        BlockManager.release = _lenient
        import _pytest.python
        _collect = _pytest.python.Module.collect
        _pytest.python.Module.collect = lambda self: [c for c in _collect(self) if "double_free" not in c.name]
        """)),
}
LINUX = sys.platform == "linux"
if not LINUX:  # only Linux lets the grader adopt and kill a process that left the worker's session
    del ROWS["detached"]


def _submit(copy: Path, row: Row) -> None:
    """Write the row's block_manager.py into the homework copy."""
    path = copy / "block_manager.py"
    if row.honest:
        text = (REPO_ROOT / "step02_paged" / "block_manager.py").read_text()
        if row.allocate:  # the attack runs first, then the reference body
            begin = "        # BEGIN SOLUTION task2.allocate_free points=2\n"
            text = text.replace(begin, begin + textwrap.indent(row.allocate, " " * 8), 1)
    else:
        text = path.read_text()
        assert text.count(STUB) == 2
        for body in (row.allocate, row.release):
            if body is not None:
                text = text.replace(STUB, textwrap.indent(body, " " * 8).strip(), 1)
    path.write_text(text + ("\n" + row.module if row.module else ""))


# The rows' checks run two at a time, but their work in this process one at a time: CPython 3.11's ast.parse (which
# hw.start uses) keeps its recursion depth per interpreter, not per thread, and two threads parsing at once can
# raise "SystemError: AST constructor recursion depth mismatch" (seen under a loaded machine; cf. cpython#106905).
# Only the checks' own processes overlap.
_IN_PROCESS = threading.Lock()


def _check(release: Path, base: Path, name: str, row: Row) -> dict:
    with _IN_PROCESS:
        root = release
        if row.own_release:
            root = base / f"release-{name}"
            shutil.copytree(release, root)
        dest = root / f"hw-{name}"
        _submit(hw.start("step02", dest, root=root), row)
        output = dest / "results.json"
        before = {p: p.read_bytes() for p in (root / "tests/step02/test_block_manager.py",
                                              root / "step02_paged/block_manager.py")}
    argv = [sys.executable, "-m", "course", "homework", "check", "step02", "--task", TASK, "--dest",
            str(dest), "--format", "json", "--output", str(output), *row.args]
    began = time.monotonic()
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")})
    seconds = time.monotonic() - began
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    result = json.loads(output.read_text())
    return {"result": result, "seconds": seconds, "output": output, "dest": dest, "before": before}


@pytest.fixture(scope="module")
def checked(step02_release: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Each row checked by the release's own command line, two at a time (each check is its own process)."""
    base = tmp_path_factory.mktemp("tamper")
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_check, step02_release, base, name, row) for name, row in ROWS.items()}
        return {name: future.result() for name, future in futures.items()}


def _row(checked: dict, name: str) -> dict:
    result = checked[name]["result"]
    [row] = result["tasks"]
    assert row["id"] == TASK and row["max_points"] == 2 and result["max_score"] == 2
    return result


def test_the_reference_body_scores_full_points(checked: dict):
    result = _row(checked, "honest")
    assert (result["score"], result["tampering"], result["error"]) == (2, [], None)
    assert result["tasks"][0]["passed"] == 4


@pytest.mark.parametrize("name,caught", [
    ("runtest", "canary"),  # Function.runtest patched: the canary that must fail passes
    ("gc_reporter", "canary"),  # every reported outcome rewritten to passed: the same
    ("noop_tests", "canary"),  # every test function swapped for a no-op: the canary's too
    ("fake_report", "report channel"),  # fake events on every open file: not signed by the worker
])
def test_tampering_scores_zero(checked: dict, name: str, caught: str):
    result = _row(checked, name)
    assert result["score"] == 0 and any(caught in t for t in result["tampering"]), result["tampering"]


def test_a_skip_raised_from_the_students_code_is_a_failure(checked: dict):
    result = _row(checked, "skip")
    assert result["score"] == 0 and result["tasks"][0]["failed"] == 4
    assert all("raised from your code counts as a failure" in f["message"] for f in result["failures"]
               if not f.get("waits_for"))  # the engine's end-to-end tests wait for the chapter's other stubs


def test_rewritten_tests_neither_run_nor_stay(checked: dict):
    check = checked["rewrite_tests"]
    result = _row(checked, "rewrite_tests")
    assert result["score"] == 0 and result["tasks"][0]["failed"] == 4  # the instructor's tests ran, on the stubs
    assert any("test_block_manager.py was changed" in t and "restored" in t for t in result["tampering"])
    for path, data in check["before"].items():
        assert path.read_bytes() == data, f"{path} was not restored"


def test_points_come_from_before_the_run(checked: dict):
    check = checked["points"]
    result = _row(checked, "points")
    assert result["score"] == 0 and any("task2.allocate_free: 2 -> 500" in t for t in result["tampering"])
    for path, data in check["before"].items():
        assert path.read_bytes() == data, f"{path} was not restored"


@pytest.mark.skipif(not LINUX, reason="the grader adopts (and kills) a process that left its session on Linux only")
def test_a_detached_process_cannot_rewrite_the_results_file(checked: dict):
    check = checked["detached"]
    pid = int((check["dest"] / "daemon.pid").read_text())
    state = Path(f"/proc/{pid}/stat")
    assert not state.exists() or state.read_text().split(") ")[1][0] in "ZX", "the detached process survived"
    assert any("killed" in note for note in check["result"]["notes"])
    time.sleep(0.2)
    result = json.loads(check["output"].read_text())
    assert (result["score"], result["tampering"]) == (2, [])


def test_a_loop_that_ignores_sigalrm_is_killed_by_the_grader(checked: dict):
    check = checked["loop"]
    result = _row(checked, "loop")
    assert result["score"] == 0 and check["seconds"] < 60
    first = result["failures"][0]
    assert first["outcome"] == "timeout" and "the grader killed its process" in first["message"]


def test_tests_dropped_while_collecting_are_caught(checked: dict):
    result = _row(checked, "drop_tests")
    assert result["score"] == 0 and any("test_double_free_raises_and_changes_nothing" in t and "not collected" in t
                                        for t in result["tampering"])


def test_tests_changed_before_the_check_are_not_graded(step02_release: Path, tmp_path: Path):
    """In a release, the tests must be the ones its manifest hashed: a changed one is tampering (nothing runs);
    one the release did not ship is left out of the run."""
    root = tmp_path / "course"
    shutil.copytree(step02_release, root)
    dest = root / "homework"
    hw.start("step02", dest, root=root)
    (root / "tests" / "step02" / "test_mine.py").write_text("def test_mine():\n    pass\n")
    tests = root / "tests" / "step02" / "test_block_manager.py"
    tests.write_text(tests.read_text().replace("assert ", "assert True or "))
    result = hw.check("step02", dest, tasks=[TASK], root=root)
    assert result["score"] == 0 and result["tasks"][0]["total"] == 0
    assert any("test_block_manager.py differs from the release's copy" in t for t in result["tampering"])
    assert any("test_mine.py is not one of the release's test files" in n for n in result["notes"])
