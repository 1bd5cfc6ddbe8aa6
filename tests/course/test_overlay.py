"""`python -m course homework run|notebook`: a chapter's demo, a command or its notebook run on the student's
homework/ copy, with the earlier chapters from the course's reference or the student's copies (overlay.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course import homework_tool as hw
from course.chapters import chapters
from course.homework_tool.overlay import SITE, command, overlay, split_command

STUB = 'raise NotImplementedError("task91.add: see step91_fake/README.md#exercises")'
PLANTED = 'print("PLANTED-IN-THE-COPY", __file__)\n    return (a + b) * scale'
SHOW = ("import step91_fake.mathy as m, step92_uses as u; print('mathy', m.__file__); "
        "print('add', m.add(1)); print('double', u.double_add(1))")


def _planted(course: Path, dest: Path) -> Path:
    """The student's copy of chapter 91 with add's body written, and a marker printed from it."""
    copy = hw.start("step91", dest, root=course) / "mathy.py"
    copy.write_text(copy.read_text().replace(STUB, PLANTED))
    return copy


def _run(course: Path, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m course homework ARGV --root COURSE` as a student types it (from the course's folder: there
    `python -m` puts the course's own chapters first on sys.path, which the copy must still shadow)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    argv = [*argv, "--root", str(course)]
    code = f"import sys; from course.homework_tool import main; sys.exit(main({argv!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd or course, env=env,
                          timeout=300)


def test_a_command_imports_the_students_copy_not_the_course(course: Path, tmp_path: Path):
    copy = _planted(course, tmp_path / "hw")
    hw.start("step92", tmp_path / "hw", only=set(), root=course)  # chapter 92 solved, built on 91
    done = _run(course, "run", "step92", "--dest", str(tmp_path / "hw"), "--earlier", "copy", "--root", str(course),
                "--", "python", "-c", SHOW)
    assert done.returncode == 0, done.stderr
    assert f"PLANTED-IN-THE-COPY {copy}" in done.stdout
    assert "add 3.0" in done.stdout and "double 6.0" in done.stdout


def test_the_demo_is_the_default_command_and_runs_the_copy(course: Path, tmp_path: Path):
    (course / "step91_fake" / "__main__.py").write_text("from .mathy import add\n\nprint('demo', add(1))\n")
    copy = _planted(course, tmp_path / "hw")
    done = _run(course, "run", "step91", "--dest", str(tmp_path / "hw"), "--root", str(course))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"PLANTED-IN-THE-COPY {copy}", "demo 3.0"]
    assert f"step91_fake: your copy {tmp_path / 'hw' / 'step91_fake'}" in done.stderr


def test_a_stubbed_earlier_chapter_comes_from_the_reference_when_chosen(course: Path, tmp_path: Path):
    """Chapter 91 left as `start` made it (add still a stub) under a solved chapter 92: with the reference (what
    check does in a course that holds it, and what --earlier reference asks for) chapter 92 runs; with the
    student's copy it stops in the stub."""
    dest = tmp_path / "hw"
    hw.start("step91", dest, root=course)
    hw.start("step92", dest, only=set(), root=course)
    code = "import step92_uses as u; print('double', u.double_add(1))"
    for earlier in ("auto", "reference"):
        done = _run(course, "run", "step92", "--dest", str(dest), "--earlier", earlier, "--root", str(course),
                    "--", "python", "-c", code)
        assert done.returncode == 0 and "double 6.0" in done.stdout, (earlier, done.stderr)
        assert "step91_fake: the course's reference" in done.stderr
    done = _run(course, "run", "step92", "--dest", str(dest), "--earlier", "copy", "--root", str(course), "--",
                "python", "-c", code)
    assert done.returncode == 1 and "NotImplementedError: task91.add" in done.stderr
    assert "step91_fake: your copy" in done.stderr and "(still stubs: task91.add, task91.triangle)" in done.stderr


def test_in_a_student_edition_the_reference_of_a_stubbed_chapter_is_refused(course: Path, tmp_path: Path):
    """A course whose chapter 91 is stubbed (an edition that hands it out) has no reference of it: --earlier
    reference says so, while auto takes the student's copy, as check does."""
    edition = hw.start("step91", tmp_path / "edition", root=course).parent  # chapter 91 stubbed in the course
    hw.start("step92", tmp_path / "edition", only=set(), root=course)
    (edition / "tests").mkdir()
    dest = tmp_path / "hw"
    _planted(course, dest)
    hw.start("step92", dest, only=set(), root=course)
    with pytest.raises(hw.CheckError, match="step91_fake is stubbed in this edition of the course"):
        overlay("step92", dest, "reference", edition)
    auto = overlay("step92", dest, "auto", edition)
    assert auto.copies == {"step92_uses": dest / "step92_uses", "step91_fake": dest / "step91_fake"}


def test_the_notebook_runs_headless_on_the_copy(course: Path, tmp_path: Path):
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {}, "outputs": [],
                           "source": ["from step91_fake.mathy import add\n", "print('notebook', add(1))"]}],
                "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
                "nbformat": 4, "nbformat_minor": 5}
    (course / "notebooks").mkdir()
    (course / "notebooks" / "91_fake.ipynb").write_text(json.dumps(notebook))
    copy = _planted(course, tmp_path / "hw")
    done = _run(course, "notebook", "step91", "--dest", str(tmp_path / "hw"), "--execute")
    assert done.returncode == 0, done.stderr
    executed = tmp_path / "hw" / "notebooks" / "91_fake.ipynb"
    text = "".join("".join(o.get("text", "")) for o in json.loads(executed.read_text())["cells"][0]["outputs"])
    assert text.splitlines() == [f"PLANTED-IN-THE-COPY {copy}", "notebook 3.0"]
    assert "outputs\": []" in (course / "notebooks" / "91_fake.ipynb").read_text(), "the course's notebook untouched"


def test_bad_input_gets_a_clear_error(course: Path, tmp_path: Path, capsys):
    argv = ["--dest", str(tmp_path / "hw"), "--root", str(course)]
    assert hw.main(["run", "step99", *argv]) == 2
    assert "homework run: unknown chapter 'step99'; chapters: step91_fake, step92_uses" in capsys.readouterr().err
    assert hw.main(["notebook", "step91", *argv]) == 2
    assert ("no student copy at" in (err := capsys.readouterr().err)
            and "run: python -m course homework start step91" in err)
    hw.start("step91", tmp_path / "hw", root=course)
    assert hw.main(["notebook", "step91", *argv]) == 2
    assert "step91_fake has no notebook" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        hw.main(["run", "step91", "--earlier", "mine", *argv])
    assert "invalid choice: 'mine'" in capsys.readouterr().err


def test_the_command_line_is_the_venvs_python():
    assert split_command(["run", "step02", "--dest", "d", "--", "python", "-m", "x", "--", "y"]) == (
        ["run", "step02", "--dest", "d"], ["python", "-m", "x", "--", "y"])
    assert split_command(["check", "step02", "--", "x"]) == (["check", "step02", "--", "x"], [])
    assert command([], "step02_paged") == [sys.executable, "-m", "step02_paged"]
    assert command(["--prompt", "Hi"], "step02_paged") == [sys.executable, "-m", "step02_paged", "--prompt", "Hi"]
    assert command(["python", "-m", "x"], "step02_paged") == [sys.executable, "-m", "x"]
    assert command(["jupyter", "lab"], "step02_paged") == ["jupyter", "lab"]


@pytest.mark.skipif(any(hw.stubbed_tasks(c) for c in chapters()), reason="a student release: no reference")
def test_a_chapter_of_the_course_runs_from_the_copy(tmp_path: Path):
    """This course's chapter 2 on a student's copy: its modules come from the copy, chapter 1 from the reference
    although the student's copy of it is still all stubs (or from that copy, with --earlier copy)."""
    dest = tmp_path / "hw"
    hw.start("step01", dest)
    hw.start("step02", dest)
    code = "import step01_kvcache.rope as r, step02_paged.slot_mapping as s; print(r.__file__); print(s.__file__)"
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    course = SITE.parents[2]
    for earlier, rope in (("auto", course / "step01_kvcache"), ("copy", dest / "step01_kvcache")):
        env = overlay("step02", dest, earlier).env(course, base)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=course,
                              timeout=300)
        expected = [str(rope / "rope.py"), str(dest / "step02_paged" / "slot_mapping.py")]
        assert done.stdout.splitlines() == expected, done.stderr


def test_start_says_how_to_run_the_demo_and_the_notebook_on_the_copy(course: Path, tmp_path: Path, capsys):
    assert hw.main(["start", "step91", "--dest", str(tmp_path / "hw"), "--root", str(course)]) == 0
    assert ("Run the chapter's demo and notebook on it: python -m course homework run step91, python -m course "
            "homework notebook step91") in capsys.readouterr().out
