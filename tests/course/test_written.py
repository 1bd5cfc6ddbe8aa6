"""The written part of the homework: every thought question of every chapter has points, in one form, and the
README states their total apart from the autograded tasks' total (course/homework_tool/written.py reads both)."""
from __future__ import annotations

import re

import pytest

from course.chapters import chapters
from course.homework_tool import find_tasks, task_points, written
from course.paths import REPO_ROOT

ASKING = [c for c in chapters() if written.HEADING in (REPO_ROOT / c / "README.md").read_text()]


def test_every_chapter_asks_thought_questions():
    assert ASKING == chapters()


@pytest.mark.parametrize("chapter", ASKING)
def test_every_question_has_points_and_the_total_is_their_sum(chapter: str):
    asked = written.questions(chapter)
    assert [q.number for q in asked] == list(range(1, len(asked) + 1)), "questions numbered 1..N"
    assert not [q.number for q in asked if q.points is None], "a question without `*(P points)*` at its start"
    assert all(q.points > 0 for q in asked)
    assert written.stated_total(chapter) == sum(q.points for q in asked), "the written part's stated total"
    assert not re.search(r"\d+ points?\)\*", " ".join(q.text for q in asked)), "points given twice in a question"


@pytest.mark.parametrize("chapter", ASKING)
def test_the_written_total_is_said_apart_from_the_tasks_total(chapter: str):
    section = " ".join(written.section((REPO_ROOT / chapter / "README.md").read_text()).split())
    tasks = sum(task_points(find_tasks(chapter)).values())
    assert f"which are autograded ({tasks} points in all)" in section


def test_parse_reads_the_points_tag_and_leaves_it_out_of_the_text():
    readme = ("# Chapter 91 — fake\n\n## Exercises\n\n**Thought questions**\n\nThe written part is worth 5 points "
              "in all.\n\n1. *(3 points)* Why\n   this? See [unit 1](01_x.md#a).\n2. *(2 points)* And that?\n"
              "3. No points.\n\n**Homework.** ...\n")
    asked = written.parse(readme)
    assert asked == [written.Question(1, 3, "Why this? See [unit 1](01_x.md#a)."),
                     written.Question(2, 2, "And that?"), written.Question(3, None, "No points.")]
    assert written.plain(asked[0].text) == "Why this? See unit 1."
    assert written.parse("# no questions\n") == []
