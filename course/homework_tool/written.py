"""The written part of a chapter's homework: its thought questions with their points, the students' answer
template made from them, and the instructors' rubrics.

The chapter's README is the one source of the questions: its `## Exercises` hold `**Thought questions**`, numbered
1..N, each opening with its points (`1. *(4 points)* How much ...`), and a sentence that states the written part's
total (`the written part is worth 18 points in all`), apart from the autograded tasks' total. `questions` reads
them, `template` writes the students' answer sheet from them (`python -m course homework written stepNN`;
`homework start` puts it beside the code as THOUGHT_QUESTIONS.md, and `release` into `written/stepNN.md`), and
`rubric` reads an instructor's rubric (`instructors/rubrics/stepNN.md`, left out of every release with the keys in
`instructors/answers/`): per question, items of points that add up to the question's.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import NamedTuple

from ..paths import REPO_ROOT
from .tasks import DEFAULT_DEST, CheckError, resolve_chapter, start

TEMPLATE = "THOUGHT_QUESTIONS.md"  # the student's answer sheet, in their copy of the chapter
RELEASED = "written"  # the release's folder of answer sheets, one per chapter: written/stepNN.md
RUBRICS = Path("instructors") / "rubrics"  # instructors only, beside the keys in instructors/answers/
HEADING = "**Thought questions**"
WIDTH = 100  # the answer sheet's lines, in characters
_QUESTION = re.compile(r"^(\d+)\. (.*?)(?=^\d+\. |\Z)", re.M | re.S)
POINTS = re.compile(r"\A\*\((\d+) points?\)\* ")  # what opens each question's text
TOTAL = re.compile(r"the written part is worth (\d+) points in all")
_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\([^)\s]*\)")


class Question(NamedTuple):
    """A thought question of a chapter's README: its number, points (None: the README gives none) and text (its
    points tag removed, its lines joined)."""

    number: int
    points: int | None
    text: str


def _readme(chapter: str, root: Path | None) -> tuple[str, str]:
    """The chapter's package and its README's text (empty when it has none)."""
    package, _ = resolve_chapter(chapter, root)
    readme = (root or REPO_ROOT) / package / "README.md"
    return package, readme.read_text() if readme.is_file() else ""


def section(readme: str) -> str:
    """The README's thought questions: from `**Thought questions**` to the homework (empty when it asks none)."""
    if HEADING not in readme:
        return ""
    return readme.split(HEADING, 1)[1].split("**Homework", 1)[0]


def parse(readme: str) -> list[Question]:
    """The thought questions of a README's text, in order."""
    out = []
    for number, body in _QUESTION.findall(section(readme)):
        text = " ".join(body.split())
        points = POINTS.match(text)
        out.append(Question(int(number), int(points[1]) if points else None, text[points.end():] if points else text))
    return out


def questions(chapter: str, root: Path | None = None) -> list[Question]:
    """The chapter's thought questions ('step01' or 'step01_kvcache'), as its README asks them."""
    return parse(_readme(chapter, root)[1])


def stated_total(chapter: str, root: Path | None = None) -> int | None:
    """The written part's total as the chapter's README states it (None: it states none)."""
    found = TOTAL.search(" ".join(section(_readme(chapter, root)[1]).split()))
    return int(found[1]) if found else None


def plain(text: str) -> str:
    """Markdown links as their text: the answer sheet is read away from the lessons it would link to."""
    return _LINK.sub(r"\1", text)


def template(chapter: str, root: Path | None = None) -> str:
    """The students' answer sheet of the chapter's written part: each question's number, points and text, and room
    for the answer. Refuses a chapter whose questions lack points (the README is to be fixed, not guessed)."""
    package, readme = _readme(chapter, root)
    asked = parse(readme)
    if not asked:
        raise CheckError(f"{package}/README.md asks no thought questions: there is no written part")
    if missing := [q.number for q in asked if q.points is None]:
        raise CheckError(f"{package}/README.md: thought question(s) {', '.join(map(str, missing))} give no points "
                         "(`N. *(P points)* ...`)")
    title = readme.split("\n", 1)[0].lstrip("# ").strip()
    total = sum(q.points for q in asked)
    lines = [f"# Thought questions · {title}", "",
             _wrap(f"*Written by `python -m course homework written {package.split('_')[0]}` from the Exercises of "
                   f"`{package}/README.md`.*"), "",
             _wrap(f"The written part of this chapter: {len(asked)} questions, {total} points in all, graded by hand "
                   "(the homework's tasks are graded apart, by `homework check` and the autograder). Write each "
                   "answer below its question: say how you got each number (the formula, the code or the "
                   "measurement you used) and why, in your own words. Hand this file in as your course asks (the "
                   "file itself, or a PDF of it)."), "", "Name:", ""]
    for q in asked:
        lines += [f"## Question {q.number} ({_points(q.points)})", "",
                  _wrap(plain(q.text), "> "), "", "**Answer.**", "", "", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _points(n: int) -> str:
    return f"{n} point{'s' if n != 1 else ''}"


_SHEET = re.compile(r"^## Question (\d+) \((\d+) points?\)\n\n((?:> .*\n)+)", re.M)
_SHEET_TOTAL = re.compile(r"(\d+) questions, (\d+) points in all")


def parse_template(sheet: str) -> tuple[int | None, list[Question]]:
    """What an answer sheet says: its total and its questions (number, points, text as quoted, links as text)."""
    total = _SHEET_TOTAL.search(" ".join(sheet.split()))
    asked = [Question(int(n), int(p), " ".join(quoted.replace("\n> ", " ")[2:].split()))
             for n, p, quoted in _SHEET.findall(sheet)]
    return (int(total[2]) if total else None), asked


def _wrap(text: str, prefix: str = "") -> str:
    """`text` in lines of at most WIDTH characters, each opening with `prefix`, inline `code` never cut."""
    protected = re.sub(r"`[^`]*`", lambda m: m[0].replace(" ", "\0"), text)
    return textwrap.fill(protected, WIDTH, initial_indent=prefix, subsequent_indent=prefix, break_long_words=False,
                         break_on_hyphens=False).replace("\0", " ")


def write_template(chapter: str, path: Path | str, root: Path | None = None) -> Path:
    """The answer sheet written to `path` (its folder made); returns the path."""
    path = Path(path)
    text = template(chapter, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def has_written_part(chapter: str, root: Path | None = None) -> bool:
    """Whether the chapter's README asks thought questions."""
    return bool(questions(chapter, root))


# ---------------------------------------------------------------- the instructors' rubrics

_RUBRIC_QUESTION = re.compile(r"^## (\d+)\. (.*?)\((\d+) points?\)\s*$", re.M)
_ITEM = re.compile(r"^- \*\*(\d+)\*\* (.*?)(?=^- |^#|\Z)", re.M | re.S)


class Item(NamedTuple):
    """What earns `points` of a question: one line of its rubric."""

    points: int
    text: str


class Rubric(NamedTuple):
    """A question's rubric: its number, short title, points and the items that share them."""

    number: int
    title: str
    points: int
    items: list[Item]


def rubric_path(chapter: str, root: Path | None = None) -> Path:
    package, _ = resolve_chapter(chapter, root)
    return (root or REPO_ROOT) / RUBRICS / f"{package.split('_')[0]}.md"


def parse_rubric(text: str) -> list[Rubric]:
    """A rubric file's questions (`## N. title (P points)`) and their items (`- **p** what earns p points`)."""
    parts = _RUBRIC_QUESTION.split(text)
    out = []
    for number, title, points, body in zip(parts[1::4], parts[2::4], parts[3::4], parts[4::4]):
        items = [Item(int(p), " ".join(t.split())) for p, t in _ITEM.findall(body)]
        out.append(Rubric(int(number), title.strip(), int(points), items))
    return out


def rubric(chapter: str, root: Path | None = None) -> list[Rubric]:
    """The chapter's rubric (instructors/rubrics/stepNN.md), question by question."""
    return parse_rubric(rubric_path(chapter, root).read_text())


def start_with_sheet(chapter: str, dest: Path | str = DEFAULT_DEST, force: bool = False,
                     root: Path | None = None) -> Path:
    """`homework start`: the chapter's stubbed copy (tasks.start) with the answer sheet of its thought questions
    beside it, made from the README; a sheet the student already wrote survives `--force`."""
    sheet = template(chapter, root) if has_written_part(chapter, root) else None
    return start(chapter, dest, force, root=root, beside={TEMPLATE: sheet} if sheet else None)
