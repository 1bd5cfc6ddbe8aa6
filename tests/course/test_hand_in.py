"""Each chapter's Exercises says which files a student hands in: exactly those `homework start` lists and the
autograder looks for (`submission_files`: the package's files that hold a task's markers)."""
from __future__ import annotations

import re

import pytest

from course.chapters import chapters
from course.homework_tool.tasks import submission_files
from course.paths import REPO_ROOT

HAND_IN = re.compile(r"^\*\*Hand in\*\* these files of your `homework/(\w+)/`[^:]*: (.*)$", re.M)


@pytest.mark.parametrize("chapter", chapters())
def test_the_exercises_list_the_files_to_hand_in(chapter: str):
    text = (REPO_ROOT / chapter / "README.md").read_text()
    found = HAND_IN.findall(text)
    assert len(found) == 1, f"{chapter}/README.md: one **Hand in** line in its Exercises"
    folder, files = found[0]
    assert folder == chapter
    assert re.findall(r"\[`([^`]+)`\]\(\1\)", files) == submission_files(chapter.split("_")[0])
