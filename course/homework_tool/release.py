"""A student edition of the course: nbgrader's "generate assignment", for a whole repository.

`release(dest)` copies every file of the course that git tracks (or, outside git, every file that is not
a build output) to `dest`, stubs every marked body of the chapters handed out exactly as `homework start`
does (signatures and docstrings kept, `raise NotImplementedError` in place of the body), and leaves out the
instructor-only files: the answer keys and the tests that check them, the root README's sections for
instructors, and the notebooks' outputs (the reference computed them). Chapters are discovered (every
`stepNN_*` package), so a new chapter with markers is released without registering it anywhere. Before
anything is written, the release is searched for the bodies it stubs (leaks.py): one found anywhere else,
renamed or not, stops the release; so does a clause of an answer key or a rubric quoted anywhere, and a markdown
file of the release (a README, a notebook's markdown) whose link, or inline `code` naming a path of the course,
leads to a file the release leaves out (`dangling_references`). The release adds the students' answer sheet of each
chapter's thought questions, made from its README (written.py): `written/stepNN.md`.

In the release there is no reference: the tests of a stubbed chapter fail (they do not crash the run),
the homework proof skips, and `homework check` grades the student's copies as it does here. The release's
.course-release holds a manifest (integrity.py): the sha256 of every test file, conftest.py and the pytest
config, and every task's points, which `check` verifies before and after each run.
"""
from __future__ import annotations

import json
import posixpath
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote

from ..markdown import code_parts, is_local, links, notebook_cells
from ..paths import REPO_ROOT, shown
from .integrity import MARKER, manifest
from .leaks import describe, instructor_leaks, leaks_in
from .markers import make_stub
from .tasks import CheckError, find_tasks, select_chapters, task_points
from .written import RELEASED, has_written_part, template

# Instructor-only: never in a release (answer keys, and the tests that hold their numbers).
INSTRUCTOR_ONLY = ("instructors", "tests/instructors")
# What a release is made of when the course is not a git checkout: everything but these.
_NOT_SOURCE = {".git", ".venv", "homework", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis",
               ".ipynb_checkpoints", "build", "dist", ".gl"}


def is_instructor_only(relative: Path) -> bool:
    parts = relative.parts
    return any(parts[: len(Path(p).parts)] == Path(p).parts for p in INSTRUCTOR_ONLY)


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout


def course_files(root: Path) -> Iterator[Path]:
    """Every file of the course, relative to `root`: git's tracked and not-ignored files when `root` is a
    checkout (so .venv, caches and homework/ copies never travel), else a walk that skips build outputs."""
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed is not None:
        names = sorted({Path(n) for n in listed.split("\0") if n})
        yield from (n for n in names if (root / n).is_file() and not (root / n).is_symlink())
        return
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if path.is_file() and not path.is_symlink() and not _NOT_SOURCE & set(relative.parts[:-1] or ()) \
                and relative.parts[0] not in _NOT_SOURCE and not path.name.endswith((".pyc", ".egg-info")):
            yield relative


def release(dest: Path | str, chapters: Iterable[str] | None = None, root: Path | None = None,
            force: bool = False) -> Path:
    """Write the student edition of the course at `root` to `dest`; `chapters` are stubbed (default: all).

    Every file that changes is made, and the whole release searched for solutions, before anything is
    written: a bad marker or a task given away elsewhere leaves no half-made release.
    """
    root = (root or REPO_ROOT).resolve()
    dest = Path(dest).resolve()
    if dest == root or root.is_relative_to(dest):
        raise CheckError(f"{dest} would overwrite the course itself")
    if dest.exists() and any(dest.iterdir()):
        if not (force and (dest / MARKER).is_file()):
            raise FileExistsError(f"{shown(dest)} is not empty" + (
                "; pass --force to replace the earlier release there" if (dest / MARKER).is_file() else
                " and holds no earlier release: choose an empty folder"))
    stubbed = select_chapters(chapters, root)
    files = [f for f in course_files(root) if not is_instructor_only(f) and not (root / f).is_relative_to(dest)]
    texts: dict[Path, str] = {}
    for package in stubbed:
        find_tasks(package, root)  # points must agree across the chapter's markers
        for f in files:
            if f.parts[0] == package and f.suffix == ".py":
                texts[f] = make_stub((root / f).read_text(), None, package, str(f))
    for f in files:
        if f == Path("README.md"):
            texts[f] = student_readme((root / f).read_text())
        elif f.parts[0] == "notebooks" and f.suffix == ".ipynb":
            texts[f] = cleared_notebook((root / f).read_text(), "step" + f.name[:2])
    sheets = {Path(RELEASED) / f"{p.split('_')[0]}.md": template(p, root) for p in select_chapters(None, root)
              if has_written_part(p, root)}  # the written part's answer sheets, one per chapter
    files += [f for f in sheets if f not in files]
    texts |= sheets
    written = _texts(root, files, texts)
    if found := leaks_in(written, root, stubbed):
        raise CheckError(f"the release would give {len({leak.task for leak in found})} task(s) away, so nothing "
                         f"was written; each of these restates a body that the release stubs:\n{describe(found)}\n"
                         "Call the task's function there instead of restating it.")
    if found := instructor_leaks(written, root):
        raise CheckError(f"the release would quote the instructors' answer keys or rubrics, so nothing was written:\n"
                         f"{describe(found)}\nSay it in the lesson's own words, or leave it to the key.")
    shipped = {str(f) for f in files}
    if dangling := dangling_references(written, shipped, {str(f) for f in course_files(root)} - shipped):
        raise CheckError(f"the release's markdown would point at {len(dangling)} thing(s) it leaves out, so nothing "
                         "was written:\n" + "\n".join(f"  {d.file}:{d.line}: {d.target} ({d.why})" for d in dangling)
                         + "\nLink only to what students get, or move the sentence into a section for instructors.")
    if dest.exists():
        shutil.rmtree(dest)
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        if f in texts:
            target.write_text(texts[f])
            if (root / f).is_file():  # not the answer sheets, which the release writes
                shutil.copymode(root / f, target)
        else:
            shutil.copy2(root / f, target)
    if stubbed and (root / "pyproject.toml").is_file() and not (root / "ruff.toml").exists():
        (dest / "ruff.toml").write_text(_ruff_config(stubbed))
    commit = (_git(root, "rev-parse", "HEAD") or "").strip() or None
    tasks = {p: task_points(find_tasks(p, dest)) for p in stubbed}
    (dest / MARKER).write_text(json.dumps({"stubbed": tasks, "from_commit": commit, "manifest": manifest(dest)},
                                          indent=1) + "\n")
    return dest


def _texts(root: Path, files: list[Path], changed: dict[Path, str]) -> dict[str, str]:
    """What the release's text files will hold (path -> text): `changed`, else the course's file."""
    out = {}
    for f in files:
        try:
            out[str(f)] = changed[f] if f in changed else (root / f).read_text()
        except UnicodeDecodeError:
            continue  # a picture or another binary file: no code in it
    return out


class Dangling(NamedTuple):
    """A reference in the release's markdown (file, line, what it names) to something the release does not hold."""

    file: str
    line: int
    target: str
    why: str


_PATHLIKE = re.compile(r"[\w.-]+(?:/[\w.-]+)+/?")  # `tests/instructors`, `results/h200.json`: a path, no spaces


def _markdown(files: Mapping[str, str]) -> Iterator[tuple[str, str, str]]:
    """(file, where a reader would say it is, markdown text) of every `.md` file and notebook markdown cell."""
    for name, text in sorted(files.items()):
        if name.endswith(".md"):
            yield name, name, text
        elif name.endswith(".ipynb"):
            for i, source in notebook_cells(text, ("markdown",)):
                yield name, f"{name} (cell {i})", source


def dangling_references(files: Mapping[str, str], shipped: set[str], left_out: set[str]) -> list[Dangling]:
    """References in the markdown of `files` (path in the release -> text) that lead out of the release: a link
    or an image whose target is no file (or folder of files) in `shipped`, and inline code that names a path of
    the course that the release leaves out (`left_out`, e.g. `tests/instructors`), relative to the file or to
    the top. URLs and anchors of the same page are not checked; a link's anchor (`#exercises`) is dropped."""
    def holds(paths: set[str], path: str) -> bool:
        return path in paths or any(p.startswith(path.rstrip("/") + "/") for p in paths)

    out = []
    for name, where, text in _markdown(files):
        folder = posixpath.dirname(name)
        for offset, target in links(text):
            if not is_local(target):
                continue
            path = posixpath.normpath(posixpath.join(folder, unquote(target.split("#", 1)[0])))
            if target.split("#", 1)[0] and not holds(shipped, path):
                why = "left out of the release" if holds(left_out, path) else "no such file"
                out.append(Dangling(where, text.count("\n", 0, offset) + 1, target, why))
        for offset, code in code_parts(text):
            for m in _PATHLIKE.finditer(code):
                if m.start() or m.end() != len(code.strip()):
                    continue  # a path alone in its span, not one inside a command or a formula
                places = {posixpath.normpath(posixpath.join(folder, m[0])), posixpath.normpath(m[0])}
                if any(holds(left_out, p) for p in places) and not any(holds(shipped, p) for p in places):
                    out.append(Dangling(where, text.count("\n", 0, offset) + 1, m[0], "left out of the release"))
    return out


# Sections of the root README that speak to instructors (whole sections: a heading and what follows it up to
# the next heading of the same or a higher level). Students read the rest.
INSTRUCTOR_HEADINGS = re.compile(r"instructor|answer key|answers|gradescope|\brelease", re.IGNORECASE)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def student_readme(text: str) -> str:
    """The README without its sections for instructors: each heading that INSTRUCTOR_HEADINGS matches is
    removed with everything up to the next heading of the same or a higher level (lines inside fenced code
    blocks are not headings: a shell comment `# ...` is not one)."""
    out: list[str] = []
    dropping: int | None = None  # the level of the heading being removed
    fenced = False
    for line in text.splitlines(keepends=True):
        heading = None if fenced else _HEADING.match(line)
        if _FENCE.match(line):
            fenced = not fenced
        if heading:
            level = len(heading[1])
            if dropping is not None and level <= dropping:
                dropping = None
            if dropping is None and INSTRUCTOR_HEADINGS.search(heading[2]):
                dropping = level
        if dropping is None:
            out.append(line)
    return "".join(out)


NOTEBOOK_NOTE = ("*Student edition: its outputs were cleared (the reference solutions computed them). Run it on "
                 "your homework copy, once you have written the chapter's tasks, with `python -m course homework "
                 "notebook {chapter}`.*")


def cleared_notebook(text: str, chapter: str) -> str:
    """A notebook without outputs (the reference solutions computed them) and with NOTEBOOK_NOTE, naming its chapter
    (`stepNN`, NN the number its file name starts with), at the top."""
    notebook = json.loads(text)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    note = {"cell_type": "markdown", "id": "student-edition-note", "metadata": {},
            "source": [NOTEBOOK_NOTE.format(chapter=chapter)]}
    if (notebook.get("nbformat", 4), notebook.get("nbformat_minor", 0)) < (4, 5):
        del note["id"]  # cell ids came with nbformat 4.5
    notebook["cells"].insert(0, note)
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def _ruff_config(stubbed: list[str]) -> str:
    """The project's lint settings, minus what a stub leaves behind: imports and names only the solution
    used (F401, F841) and names a stubbed region defined for the code after it (F821)."""
    lines = ["# Written by `python -m course homework release`: the project's settings (pyproject.toml), except",
             "# that stubbed bodies leave imports and names behind that only the solutions use.",
             'extend = "pyproject.toml"', "", "[lint.per-file-ignores]"]
    lines += [f'"{package}/**/*.py" = ["F401", "F821", "F841"]' for package in stubbed]
    return "\n".join(lines) + "\n"


def is_release(root: Path | None = None) -> bool:
    """Whether `root` is a student release (made by `release`), where reference bodies are stubs."""
    return ((root or REPO_ROOT) / MARKER).is_file()
