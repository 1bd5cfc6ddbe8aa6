"""The rubrics of the thought questions (instructors/rubrics/stepNN.md) against the chapters' READMEs and keys.

Each chapter's rubric covers every question its README asks, with the points the README gives it, in items that
add up to them; and it quotes no figure of its own: every number in it is the key's for that question, the
question's, or a cross-reference, so a rerun that moves a figure moves it in the key (which
test_answer_keys.py checks) and nowhere else. Instructors only: the student release leaves the rubrics out.
"""
from __future__ import annotations

import re

import pytest

from course.chapters import chapters
from course.homework_tool import written
from course.paths import REPO_ROOT

RUBRICS = REPO_ROOT / written.RUBRICS
KEYS = REPO_ROOT / "instructors" / "answers"
pytestmark = pytest.mark.skipif(not RUBRICS.is_dir(), reason="the rubrics are not part of a student release")
ASKING = [c for c in chapters() if written.questions(c)]
NUMBER = re.compile(r"(?<!\w)[0-9]+(?:[,.][0-9]+)*")
CROSS_REFERENCE = re.compile(r"\b(?:chapter|question)s? \d+", re.I)


def numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in NUMBER.findall(CROSS_REFERENCE.sub("", text))}


def key_answers(chapter: str) -> dict[int, str]:
    parts = re.split(r"^## (\d+)\. ", (KEYS / f"{chapter.split('_')[0]}.md").read_text(), flags=re.M)
    return {int(n): body for n, body in zip(parts[1::2], parts[2::2])}


def test_every_chapter_with_questions_has_a_rubric():
    assert ASKING, "no chapter asks thought questions?"
    missing = [c for c in ASKING if not written.rubric_path(c).is_file()]
    assert not missing, f"no rubric for {missing} (instructors/rubrics/stepNN.md)"
    extra = {p.stem for p in RUBRICS.glob("*.md")} - {c.split("_")[0] for c in ASKING}
    assert not extra, f"rubrics of no chapter: {extra}"


@pytest.mark.parametrize("chapter", ASKING)
def test_the_rubric_covers_every_question_with_its_points(chapter: str):
    asked = {q.number: q.points for q in written.questions(chapter)}
    rubric = written.rubric(chapter)
    assert [r.number for r in rubric] == sorted(asked), "the rubric's questions, in order, are the README's"
    for r in rubric:
        assert r.points == asked[r.number], f"question {r.number}: the README gives {asked[r.number]} points"
        assert len(r.items) >= 2, f"question {r.number}: one item is no rubric (what earns part of it?)"
        assert sum(i.points for i in r.items) == r.points, f"question {r.number}: its items add up to the points"
        assert all(i.points > 0 and i.text for i in r.items), f"question {r.number}: an empty item"


@pytest.mark.parametrize("chapter", ASKING)
def test_the_rubric_quotes_only_the_key_s_and_the_question_s_figures(chapter: str):
    asked = {q.number: q.text for q in written.questions(chapter)}
    keys = key_answers(chapter)
    stray = []
    for r in written.rubric(chapter):
        known = numbers(keys.get(r.number, "")) | numbers(asked[r.number])
        for text in [r.title, *(i.text for i in r.items)]:
            stray += [f"question {r.number}: {n} in {text[:60]!r}" for n in sorted(numbers(text) - known)]
    assert not stray, "numbers that neither the key's answer nor the question states:\n" + "\n".join(stray)


def test_the_rubric_parser():
    text = ("# Chapter 91\n\nPreamble.\n\n## 1. Why add? (3 points)\n\n- **2** The sum,\n  on two lines.\n"
            "- **1** The scale.\n\n## 2. Count (1 point)\n\n- **1** Counted.\n")
    assert written.parse_rubric(text) == [
        written.Rubric(1, "Why add?", 3, [written.Item(2, "The sum, on two lines."), written.Item(1, "The scale.")]),
        written.Rubric(2, "Count", 1, [written.Item(1, "Counted.")])]
