"""The written part of the homework: every thought question of every chapter has points, in one form, and the
README states their total apart from the autograded tasks' total (course/homework_tool/written.py reads both); the
students' answer sheet made from them (`homework written`, and `homework start` beside the code) agrees with it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from course import homework_tool as hw
from course.chapters import chapters
from course.homework_tool import find_tasks, task_points, written
from course.homework_tool import main as hw_main
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
    assert f"the tasks below are autograded ({tasks} points in all)" in section


def test_parse_reads_the_points_tag_and_leaves_it_out_of_the_text():
    readme = ("# Chapter 91 — fake\n\n## Exercises\n\n**Thought questions**\n\nThe written part is worth 5 points "
              "in all.\n\n1. *(3 points)* Why\n   this? See [unit 1](01_x.md#a).\n2. *(2 points)* And that?\n"
              "3. No points.\n\n**Homework.** ...\n")
    asked = written.parse(readme)
    assert asked == [written.Question(1, 3, "Why this? See [unit 1](01_x.md#a)."),
                     written.Question(2, 2, "And that?"), written.Question(3, None, "No points.")]
    assert written.plain(asked[0].text) == "Why this? See unit 1."
    assert written.parse("# no questions\n") == []


# ---------------------------------------------------------------- the answer sheet


@pytest.mark.parametrize("chapter", ASKING)
def test_the_answer_sheet_is_the_readme_s_questions_with_their_points(chapter: str):
    total, sheet = written.parse_template(written.template(chapter))
    asked = written.questions(chapter)
    assert [(q.number, q.points) for q in sheet] == [(q.number, q.points) for q in asked]
    assert [q.text for q in sheet] == [written.plain(q.text) for q in asked], "each question quoted whole"
    assert total == written.stated_total(chapter) == sum(q.points for q in asked)
    assert "](" not in written.template(chapter), "no link: the sheet is read away from the lessons"


FAKE_README = """# Chapter 91 — a fake

## Exercises

**Thought questions**

Each question opens with its points: the written part is worth 5 points in all.

1. *(3 points)* Why add? See [the code](mathy.py).
2. *(2 points)* Why count?

**Homework.** ...
"""


def test_start_puts_the_answer_sheet_beside_the_code_and_force_keeps_it(course: Path, tmp_path: Path, capsys):
    (course / "step91_fake" / "README.md").write_text(FAKE_README)
    argv = ["start", "step91", "--dest", str(tmp_path / "hw"), "--root", str(course)]
    assert hw_main(argv) == 0
    sheet = tmp_path / "hw" / "step91_fake" / written.TEMPLATE
    assert sheet.read_text() == written.template("step91", course)
    assert "Answer the 2 thought questions (5 points, graded by hand) in" in capsys.readouterr().out
    sheet.write_text(sheet.read_text() + "my answers\n")
    assert hw_main([*argv, "--force"]) == 0
    assert sheet.read_text().endswith("my answers\n"), "a student's answers survive a fresh copy of the code"
    assert not (tmp_path / "hw" / "step92_uses").exists()
    assert hw_main(["start", "step92", "--dest", str(tmp_path / "hw"), "--root", str(course)]) == 0
    assert not (tmp_path / "hw" / "step92_uses" / written.TEMPLATE).exists(), "no questions, no sheet"


def test_the_written_command_prints_or_writes_the_sheet(course: Path, tmp_path: Path, capsys):
    (course / "step91_fake" / "README.md").write_text(FAKE_README)
    assert hw_main(["written", "step91", "--root", str(course)]) == 0
    assert capsys.readouterr().out == written.template("step91", course)
    out = tmp_path / "sheets" / "step91.md"
    assert hw_main(["written", "step91", "--output", str(out), "--root", str(course)]) == 0
    assert out.read_text() == written.template("step91", course)
    assert written.parse_template(out.read_text()) == (5, [written.Question(1, 3, "Why add? See the code."),
                                                           written.Question(2, 2, "Why count?")])


def test_a_question_without_points_has_no_sheet(course: Path, capsys):
    (course / "step91_fake" / "README.md").write_text(FAKE_README.replace("2. *(2 points)* ", "2. "))
    with pytest.raises(hw.CheckError, match=r"question\(s\) 2 give no points"):
        written.template("step91", course)
    assert hw_main(["written", "step91", "--root", str(course)]) == 2
    assert "give no points" in capsys.readouterr().err
    (course / "step92_uses" / "README.md").write_text("# Chapter 92\n")
    with pytest.raises(hw.CheckError, match="asks no thought questions"):
        written.template("step92", course)
