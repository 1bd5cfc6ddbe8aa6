"""The student release: stubs everywhere, no solution (verbatim or renamed), no instructor files or sections, no
reference outputs in the notebooks, and homework still works in it.

First on the fake course of conftest.py (fast), then on this course itself: every task's reference body is
searched for in the whole release, as text and as a syntax tree with its names erased. In a release there is
no reference to search for, so those tests skip.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course import homework_tool as hw
from course.chapters import chapters
from course.homework_tool import leaks, tasks, written
from course.homework_tool import release as rel
from course.paths import REPO_ROOT

REAL = REPO_ROOT
IN_A_RELEASE = any(hw.stubbed_tasks(c) for c in chapters())
NO_REFERENCE = "a student release: the bodies are stubs here, so there is no reference to search for"


@pytest.fixture
def fake(course: Path) -> Path:
    """The fake course plus what a real one has around its chapters: a README, answer keys, their tests."""
    (course / "README.md").write_text("# Fake course\n")
    (course / "instructors" / "answers").mkdir(parents=True)
    (course / "instructors" / "answers" / "step91.md").write_text("1. total * scale\n")
    (course / "tests" / "instructors").mkdir()
    (course / "tests" / "instructors" / "test_keys.py").write_text("def test_key():\n    assert 6 == 6\n")
    (course / "step91_fake" / "__pycache__").mkdir()
    (course / "step91_fake" / "__pycache__" / "mathy.cpython-311.pyc").write_bytes(b"\0")
    return course


def test_release_stubs_every_chapter_and_leaves_instructor_files_out(fake: Path, tmp_path: Path):
    out = rel.release(tmp_path / "student", root=fake)
    assert (out / "README.md").read_text() == "# Fake course\n"
    assert (out / "tests" / "step91" / "test_fake.py").is_file()
    assert not (out / "instructors").exists() and not (out / "tests" / "instructors").exists()
    assert not list(out.rglob("__pycache__"))
    mathy = (out / "step91_fake" / "mathy.py").read_text()
    assert mathy == hw.make_stub((fake / "step91_fake" / "mathy.py").read_text(), chapter="step91_fake")
    assert hw.stubbed_tasks("step91", out) == {"task91.add", "task91.triangle"}
    assert hw.stubbed_tasks("step92", out) == {"task92.double"}
    assert hw.stubbed_tasks("step91", fake) == set()
    assert json.loads((out / rel.MARKER).read_text())["stubbed"] == {
        "step91_fake": {"task91.add": 1, "task91.triangle": 1}, "step92_uses": {"task92.double": 1}}
    assert rel.is_release(out) and not rel.is_release(fake)
    assert leaks.find_leaks(out, fake) == []


def test_a_new_chapter_is_released_without_registering_it(fake: Path, tmp_path: Path):
    (fake / "step93_new").mkdir()
    (fake / "step93_new" / "__init__.py").write_text(
        "def f():\n    # BEGIN SOLUTION task93.f points=5\n    return 41 + 1\n    # END SOLUTION\n")
    out = rel.release(tmp_path / "student", root=fake)
    assert hw.stubbed_tasks("step93", out) == {"task93.f"}
    assert "41 + 1" not in (out / "step93_new" / "__init__.py").read_text()


def test_chapters_chooses_what_is_handed_out(fake: Path, tmp_path: Path):
    out = rel.release(tmp_path / "student", chapters=["step92"], root=fake)
    assert hw.stubbed_tasks("step91", out) == set() and hw.stubbed_tasks("step92", out) == {"task92.double"}
    with pytest.raises(hw.CheckError, match="unknown chapter 'step99'"):
        rel.release(tmp_path / "other", chapters=["step99"], root=fake)


def test_release_refuses_to_overwrite_what_is_not_a_release(fake: Path, tmp_path: Path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("my notes")
    with pytest.raises(FileExistsError, match="holds no earlier release"):
        rel.release(tmp_path / "mine", root=fake, force=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "my notes"
    with pytest.raises(hw.CheckError, match="overwrite the course itself"):
        rel.release(fake, root=fake)
    out = rel.release(tmp_path / "student", root=fake)
    with pytest.raises(FileExistsError, match="--force"):
        rel.release(out, root=fake)
    assert rel.release(out, root=fake, force=True) == out


def test_a_bad_marker_leaves_no_release(fake: Path, tmp_path: Path):
    (fake / "step92_uses" / "bad.py").write_text("def g():\n    # BEGIN SOLUTION t.x\n    return 1\n")
    with pytest.raises(hw.MarkerError, match=r"step92_uses/bad\.py:2:"):
        rel.release(tmp_path / "student", root=fake)
    assert not (tmp_path / "student").exists()


def test_leaks_are_found_in_any_text_file(fake: Path, tmp_path: Path):
    (fake / "step91_fake" / "stats.py").write_text(
        'def mean(values):\n    """Average."""\n    # BEGIN SOLUTION task91.mean\n    total_of_values = sum(values)\n'
        "    return total_of_values / max(len(values), 1)\n    # END SOLUTION\n")
    out = rel.release(tmp_path / "student", root=fake)
    assert leaks.find_leaks(out, fake) == []
    (out / "README.md").write_text("Hint:\n\n    return total_of_values/max(len(values), 1)\n")  # one long line
    (out / "tests" / "step91" / "helper.py").write_text(  # two consecutive lines, spaced differently
        "x = 1\ntotal_of_values  =  sum(values)\nreturn 0 if not values else ...\n\n"
        "total_of_values = sum( values )\nreturn total_of_values / n\n")
    found = leaks.find_leaks(out, fake)
    assert {(f, n, task) for f, n, task, _ in found} == {("README.md", 3, "task91.mean")}
    (out / "tests" / "step91" / "helper.py").write_text("total_of_values = sum(values)\n"
                                                         "return total_of_values / max(len(values), 1)\n")
    found = leaks.find_leaks(out, fake)
    assert {(f, n, task) for f, n, task, _ in found} == {("README.md", 3, "task91.mean"),
                                                         ("tests/step91/helper.py", 1, "task91.mean"),
                                                         ("tests/step91/helper.py", 2, "task91.mean")}


BLOCKS = '''\
def full_blocks(tokens: list[int], size: int) -> list[tuple[int, ...]]:
    """The full blocks of `size` tokens, in order."""
    # BEGIN SOLUTION task91.blocks points=2
    blocks = []
    for i in range(len(tokens) // size):
        blocks.append(tuple(tokens[i * size:(i + 1) * size]))
    return blocks
    # END SOLUTION
'''

RENAMED = '''\
"""A later chapter that restates task91.blocks under other names."""


def chunks(ids, n):
    out = []
    for j in range(len(ids) // n):
        out.append(tuple(ids[j * n:(j + 1) * n]))
    return out
'''


CHAPTER_README = """# Chapter 91 — a fake

## Exercises

**Thought questions**

Each question opens with its points: the written part is worth 3 points in all.

1. *(3 points)* Why does `add` scale the total of its two numbers, and what would a caller lose without it?

**Homework.** ...
"""
KEY = ("# Chapter 91 — answer key\n\n## 1. Why scale\n\nAsked why does add scale the total of its two numbers, and "
       "what would a caller lose without it: the caller asks for a weighted sum, and scaling the total once costs "
       "one multiply where scaling each of the numbers costs two of them.\n")
RUBRIC = ("# Chapter 91 — rubric\n\n## 1. Why scale (3 points)\n\n- **2** Names the weighted sum that a caller asks "
          "for, and the multiply that scaling the total saves over scaling each number.\n- **1** Says what is lost.\n")


@pytest.fixture
def keyed(fake: Path) -> Path:
    """The fake course with a chapter README that asks a question, its key and its rubric."""
    (fake / "step91_fake" / "README.md").write_text(CHAPTER_README)
    (fake / "instructors" / "answers" / "step91.md").write_text(KEY)
    (fake / "instructors" / "rubrics").mkdir()
    (fake / "instructors" / "rubrics" / "step91.md").write_text(RUBRIC)
    return fake


def test_the_release_carries_the_answer_sheets_and_no_key_or_rubric(keyed: Path, tmp_path: Path):
    out = rel.release(tmp_path / "student", root=keyed)
    assert (out / written.RELEASED / "step91.md").read_text() == written.template("step91", keyed)
    assert not (out / written.RELEASED / "step92.md").exists(), "chapter 92 asks no questions"
    assert not (out / "instructors").exists()
    assert leaks.find_leaks(out, keyed) == [], "the key quotes its question, which ships: no leak"
    copy = written.start_with_sheet("step91", tmp_path / "hw", root=out)  # homework start, in the release
    assert (copy / written.TEMPLATE).read_text() == written.template("step91", keyed)


@pytest.mark.parametrize("where,text,source", [
    ("step91_fake/README.md", "\nThe caller asks for a weighted sum, and scaling the total once costs one multiply\n",
     "instructors/answers/step91.md, question 1"),
    ("tests/step91/test_fake.py", "\n# names the weighted sum that a caller asks for, and the multiply that scaling\n",
     "instructors/rubrics/step91.md, question 1")])
def test_a_quoted_key_or_rubric_stops_the_release(keyed: Path, tmp_path: Path, where: str, text: str, source: str):
    """Twelve words of a key or a rubric in any file of the release stop it (case and markup aside), named with the
    file, the line and the key's question; nothing is written."""
    lines = (keyed / where).read_text().count("\n")
    (keyed / where).write_text((keyed / where).read_text() + text)
    with pytest.raises(hw.CheckError, match="quote the instructors' answer keys or rubrics") as caught:
        rel.release(tmp_path / "student", root=keyed)
    assert f"{source}: {where}:{lines + 2}: quotes the instructors' text" in str(caught.value)
    assert not (tmp_path / "student").exists()


def test_a_renamed_copy_in_a_later_chapter_stops_the_release(fake: Path, tmp_path: Path):
    (fake / "step91_fake" / "blocks.py").write_text(BLOCKS)
    (fake / "step92_uses" / "later.py").write_text(RENAMED)
    files = {"step92_uses/later.py": RENAMED}
    assert leaks.text_leaks(files, leaks.solution_bodies(fake)) == [], "no line is the same: only the shape is"
    [leak] = leaks.shape_leaks(files, leaks.solution_shapes(fake))
    assert (leak.file, leak.line, leak.task) == ("step92_uses/later.py", 5, "task91.blocks")
    assert "step91_fake/blocks.py:3 (full_blocks)" in leak.what
    with pytest.raises(hw.CheckError) as error:
        rel.release(tmp_path / "student", root=fake)
    assert "task91.blocks: step92_uses/later.py:5:" in str(error.value)
    assert not (tmp_path / "student").exists(), "a release that gives a task away is not written"
    # step91 handed out as solved reading: its body is no secret, the release goes ahead
    assert rel.release(tmp_path / "student", chapters=["step92"], root=fake).is_dir()


FORMULA = '''\
def blocks_needed(table: list[int], hits: list[int], computed: int, n: int, size: int) -> int:
    """New blocks for `n` more tokens."""
    # BEGIN SOLUTION task91.need points=3
    if n < 0 or computed < 0:
        raise ValueError(f"negative token count: {n}, {computed}")
    if not table and not hits and not computed:
        return -(-n // size)
    return max(0, -(-(computed + n) // size) - len(table) - len(hits))
    # END SOLUTION
'''


def test_a_key_formula_restated_in_another_statement_is_found(fake: Path):
    """The formula is under half of its body, but 20+ nodes: restated (here assigned, not returned) it gives
    the task away."""
    (fake / "step91_fake" / "need.py").write_text(FORMULA)
    [solution] = [s for s in leaks.solution_shapes(fake) if s.region.task == "task91.need"]
    later = "def grow(seq, bs, k):\n    want = max(0, -(-(seq.done + k) // bs) - len(seq.table) - len(seq.hits))\n"
    [leak] = leaks.shape_leaks({"step92_uses/grow.py": later}, [solution])
    assert (leak.file, leak.line, leak.task) == ("step92_uses/grow.py", 2, "task91.need")
    size = int(leak.what.split()[0])
    assert leaks.KEY_NODES <= size < leaks.SHARE * solution.size


def test_short_bodies_are_not_searched_for(fake: Path, tmp_path: Path):
    """`return 2 * add(a)` (task92.double) or a two-line loop (task91.triangle) are idioms: the same shapes
    elsewhere are no leak, and the search does not even look for them."""
    assert leaks.searched_size(10) > 10 and leaks.searched_size(30) == 15 and leaks.searched_size(400) == 20
    assert [s.parts for s in leaks.solution_shapes(fake)] == [{}, {}, {}]
    (fake / "step92_uses" / "idioms.py").write_text(
        "def f(x):\n    return 2 * g(x)\n\n\ndef h(n, t=0):\n    for k in range(n):\n        t += k\n"
        "    return t\n")
    out = rel.release(tmp_path / "student", root=fake)
    assert leaks.find_leaks(out, fake) == []


SPAN = '''\
def span(start: int, end: int, size: int) -> int:
    """Blocks an edge over [start, end) owns: one per block boundary it crosses."""
    # BEGIN SOLUTION task91.span
    return end // size - start // size
    # END SOLUTION
'''


@pytest.mark.parametrize("where,text,line", [
    ("step91_fake/README.md", "# Spans\n\nAn edge over [s, e) owns e // B − s // B blocks.\n", 3),
    ("step91_fake/README.md", "# Spans\n\nIt owns `end // 4 - start // 4` blocks, so 12 // 4 − 7 // 4 = 2.\n", 3),
    ("step91_fake/README.md", "# Spans\n\n```\nnum_blocks(a, b) = b // bs - a // bs\n```\n", 4),
    ("notes.md", "Two lines\nthen `hi//B-lo//B`\n", 2),
])
def test_a_formula_written_out_in_a_lesson_stops_the_release(fake: Path, tmp_path: Path, where: str, text: str,
                                                             line: int):
    """A task's whole expression in a README, as prose, as inline code or in a fenced block, with other names
    and numbers and with `−` for `-`, is a leak: the release is not written, and the search names the place."""
    (fake / "step91_fake" / "span.py").write_text(SPAN)
    (fake / where).write_text(text)
    [leak] = leaks.prose_leaks({where: text}, leaks.solution_formulas(fake))
    assert (leak.file, leak.line, leak.task) == (where, line, "task91.span")
    with pytest.raises(hw.CheckError, match=rf"task91.span: {re.escape(where)}:{line}:"):
        rel.release(tmp_path / "student", root=fake)
    assert not (tmp_path / "student").exists()


def test_a_lesson_may_use_the_words_and_smaller_formulas_of_a_task(fake: Path, tmp_path: Path):
    """The vocabulary around a formula is no leak: its names, a part of it (`end // B`), hyphenated words that
    read like a subtraction, a table, or the formula of another task."""
    (fake / "step91_fake" / "span.py").write_text(SPAN)
    text = ("# Spans\n\nAn edge from `start` to `end` owns the blocks whose last token it holds: `end // B` of them "
            "end before `end`.\nA copy-on-write, end-to-end, block-by-block design; `(k + 1) · B − 1`.\n\n"
            "| a | b | c |\n|---|---|---|\n| 1 // 2 | x | y |\n\nBlocks: `(n + B − 1) // B`.\n")
    (fake / "step91_fake" / "README.md").write_text(text)
    assert leaks.prose_leaks({"step91_fake/README.md": text}, leaks.solution_formulas(fake)) == []
    assert rel.release(tmp_path / "student", root=fake).is_dir()


def test_notebook_cells_are_searched_for_formulas(fake: Path):
    (fake / "step91_fake" / "span.py").write_text(SPAN)
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Spans\n\nIt owns `e // B − s // B`."),
                                               nbformat.v4.new_code_cell("print(9 // 4 - 2 // 4)")])
    found = leaks.prose_leaks({"notebooks/91.ipynb": nbformat.writes(notebook)}, leaks.solution_formulas(fake))
    assert [(leak.file, leak.line) for leak in found] == [("notebooks/91.ipynb (cell 1)", 3),
                                                         ("notebooks/91.ipynb (cell 2)", 1)]


def test_a_link_to_what_the_release_leaves_out_stops_it(fake: Path, tmp_path: Path):
    """Every markdown file the release writes may link only to files it writes: a link into the instructors'
    files, a path of them in inline code, or a link to no file at all is named with its file and line."""
    (fake / "step91_fake" / "README.md").write_text(
        "# 91\n\nSee [the key](../instructors/answers/step91.md#1) and [the tests](../tests/step91/test_fake.py),\n"
        "and `tests/instructors`, which recompute it; [a missing one](missing.md), [a site](https://example.org),\n"
        "[here](#spans), `step91_fake/mathy.py` and ![a picture](figures/none.svg).\n")
    with pytest.raises(hw.CheckError) as error:
        rel.release(tmp_path / "student", root=fake)
    message = str(error.value)
    assert "step91_fake/README.md:3: ../instructors/answers/step91.md#1 (left out of the release)" in message
    assert "step91_fake/README.md:4: tests/instructors (left out of the release)" in message
    assert "step91_fake/README.md:4: missing.md (no such file)" in message
    assert "step91_fake/README.md:5: figures/none.svg (no such file)" in message
    assert message.count("step91_fake/README.md:") == 4, message
    assert not (tmp_path / "student").exists()
    (fake / "step91_fake" / "README.md").write_text("# 91\n\n[The tests](../tests/step91/test_fake.py).\n")
    assert rel.release(tmp_path / "student", root=fake).is_dir()


def test_the_student_readme_names_no_instructor_file(real_release: Path):
    """The sections for instructors are left out, and what stays links only to what the release holds."""
    shipped = {str(f) for f in rel.course_files(real_release)}
    texts = {f: (real_release / f).read_text() for f in shipped if f.endswith((".md", ".ipynb"))}
    assert rel.dangling_references(texts, shipped, {"instructors/answers/step01.md", "tests/instructors/x.py"}) == []
    assert "instructors" not in (real_release / "README.md").read_text()


README = """# Fake course

Intro.

## For students

Run `homework start`.

## For instructors

The keys are in instructors/.

```bash
# a shell comment in a code block, not a heading
python -m course homework release ../student
```

### Uploading to Gradescope

Zip it.

## Answer keys

Secret.

### Still under the keys

## Correctness

Kept.
"""


def test_the_student_readme_leaves_out_the_instructor_sections(fake: Path, tmp_path: Path):
    (fake / "README.md").write_text(README)
    out = rel.release(tmp_path / "student", root=fake)
    assert (out / "README.md").read_text() == ("# Fake course\n\nIntro.\n\n## For students\n\nRun `homework start`."
                                               "\n\n## Correctness\n\nKept.\n")
    assert rel.student_readme("# Course\n\n## Release notes\n\nx\n\n# Next\n") == "# Course\n\n# Next\n"


def test_the_release_clears_the_notebooks_outputs(fake: Path, tmp_path: Path):
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Chapter 91"),
        nbformat.v4.new_code_cell("add(1)", execution_count=3,
                                  outputs=[nbformat.v4.new_output("execute_result", {"text/plain": "3"},
                                                                  execution_count=3)])])
    (fake / "notebooks").mkdir()
    nbformat.write(notebook, fake / "notebooks" / "91_fake.ipynb")
    out = rel.release(tmp_path / "student", root=fake)
    released = nbformat.read(out / "notebooks" / "91_fake.ipynb", as_version=4)
    nbformat.validate(released)
    note, title, code = released.cells
    assert note.cell_type == "markdown" and "python -m course homework notebook step91`" in note.source
    assert "outputs were cleared" in note.source
    assert (title.source, code.source, code.outputs, code.execution_count) == ("# Chapter 91", "add(1)", [], None)


def test_homework_works_in_a_release(fake: Path, tmp_path: Path):
    """Stubs score 0; the reference bodies copied into the student's copies score full, and a chapter is
    graded against the student's copy of the chapter it builds on (the release has no reference of it)."""
    out = rel.release(tmp_path / "student", root=fake)
    dest = out / "homework"
    for chapter in ("step91", "step92"):
        hw.start(chapter, dest, root=out)
    stubs = [hw.plan(c, dest, timeout=10, root=out) for c in ("step91", "step92")]
    assert [(r["score"], r["max_score"]) for r in hw.execute(stubs)] == [(0, 2), (0, 1)]

    shutil.copytree(fake / "step92_uses", dest / "step92_uses", dirs_exist_ok=True)
    [alone] = hw.execute([hw.plan("step92", dest, timeout=10, root=out)])
    assert alone["score"] == 0, "step92 must not pass on the stubbed step91 it builds on"
    assert alone["tasks"][0]["needs"] == ["task91.add"], "the report names the earlier task to solve first"
    assert "imported from your copy" in alone["notes"][0]

    shutil.copytree(fake / "step91_fake", dest / "step91_fake", dirs_exist_ok=True)
    full = [hw.plan(c, dest, timeout=10, root=out) for c in ("step91", "step92")]
    assert [(r["score"], r["max_score"]) for r in hw.execute(full)] == [(2, 2), (1, 1)]

    shutil.rmtree(dest / "step91_fake")
    run = hw.plan("step92", dest, timeout=10, root=out)
    assert run.built_on == [] and "no copy of it" in run.notes[0]


def test_start_in_a_release_warns_about_the_chapters_still_stubbed(fake: Path, tmp_path: Path, capsys):
    """In a release the chapter a copy builds on is a stub unless the student's copy of it is solved."""
    out = rel.release(tmp_path / "student", root=fake)
    argv = ["--dest", str(out / "homework"), "--root", str(out), "--force"]
    assert hw.main(["start", "step92", *argv]) == 0
    assert "no copy of it" in capsys.readouterr().err
    assert hw.main(["start", "step91", *argv]) == 0 and hw.main(["start", "step92", *argv]) == 0
    warning = capsys.readouterr().err
    assert warning.startswith("warning: step91_fake (which step92_uses builds on) is imported from your copy")
    assert "still has stubs (task91.add, task91.triangle)" in warning
    shutil.copytree(fake / "step91_fake", out / "homework" / "step91_fake", dirs_exist_ok=True)
    assert hw.main(["start", "step92", *argv]) == 0 and capsys.readouterr().err == ""


def test_release_command_line(fake: Path, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setattr(tasks, "REPO_ROOT", fake)
    monkeypatch.setattr(rel, "REPO_ROOT", fake)
    assert hw.main(["release", str(tmp_path / "student"), "--chapters", "step91"]) == 0
    assert "student" in capsys.readouterr().out
    assert hw.stubbed_tasks("step91", tmp_path / "student") and not hw.stubbed_tasks("step92", tmp_path / "student")
    assert hw.main(["release", str(tmp_path / "student")]) == 2
    assert "--force" in capsys.readouterr().err


# ---------------------------------------------------------------- this course


@pytest.fixture(scope="module")
def real_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if IN_A_RELEASE:
        pytest.skip(NO_REFERENCE)
    return rel.release(tmp_path_factory.mktemp("release") / "course")


@pytest.fixture(scope="module")
def real_leaks(real_release: Path) -> list[leaks.Leak]:
    """Both searches over the written release (`release` ran them before writing it, and found nothing)."""
    return leaks.find_leaks(real_release)


TASKS = [(c, t) for c in chapters() for t in hw.find_tasks(c)]


@pytest.mark.parametrize("chapter,task", TASKS, ids=[f"{c}:{t}" for c, t in TASKS])
def test_no_solution_in_the_release(chapter: str, task: str, real_release: Path, real_leaks: list[leaks.Leak]):
    """No line of the task's bodies anywhere, and no copy of them with other names in any Python source."""
    found = [leak for leak in real_leaks if leak.task == task]
    assert not found, f"{task}'s reference body survives in the release:\n{leaks.describe(found)}"
    regions = hw.find_tasks(chapter, real_release)[task]
    assert all(hw.is_stub((real_release / r.file).read_text(), r) for r in regions)


def test_the_release_is_the_whole_course_minus_instructor_files(real_release: Path):
    tracked = {f for f in rel.course_files(REAL)}
    sheets = {Path(written.RELEASED) / f"{c.split('_')[0]}.md" for c in chapters()}
    shipped = {f for f in rel.course_files(real_release)} - {Path(rel.MARKER), Path("ruff.toml")} - sheets
    assert shipped == {f for f in tracked if not rel.is_instructor_only(f)}
    for must in ("Makefile", "pyproject.toml", "README.md", "scripts/setup.sh", ".ci/run",
                 "course/homework_tool/release.py", "tests/test_homework_proof.py",
                 *[f"{c}/README.md" for c in chapters()]):
        assert (real_release / must).is_file(), must
    assert list((real_release / "notebooks").glob("*.ipynb"))
    assert not (real_release / "instructors").exists() and not (real_release / "tests" / "instructors").exists()


def test_the_release_carries_every_answer_sheet_and_quotes_no_key_or_rubric(real_release: Path,
                                                                           real_leaks: list[leaks.Leak]):
    for chapter in chapters():
        sheet = (real_release / written.RELEASED / f"{chapter.split('_')[0]}.md").read_text()
        assert sheet == written.template(chapter), chapter
    assert not (real_release / "instructors").exists()
    found = [leak for leak in real_leaks if leak.task.startswith("instructors/")]
    assert not found, f"the release quotes the instructors' keys or rubrics:\n{leaks.describe(found)}"


def test_the_release_keeps_students_out_of_the_instructors_notes(real_release: Path):
    readme = (real_release / "README.md").read_text()
    assert "## For students" in readme and "## Correctness" in readme
    assert "## For instructors" not in readme and "Gradescope" not in readme and "homework release" not in readme
    for notebook in sorted((real_release / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        note = rel.NOTEBOOK_NOTE.format(chapter="step" + notebook.name[:2])
        assert note in "".join(cells[0]["source"]), notebook.name
        code = [c for c in cells if c["cell_type"] == "code"]
        assert code and not any(c["outputs"] or c["execution_count"] for c in code), notebook.name


def test_the_release_passes_the_linter(real_release: Path):
    """Stubs leave imports and names that only the solutions used: the release's ruff.toml allows those."""
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.is_file():
        pytest.skip("ruff is not installed next to this Python")
    done = subprocess.run([str(ruff), "check", "--no-cache", "."], cwd=real_release, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:]
