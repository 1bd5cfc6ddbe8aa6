"""WORKLOADS.md against `python -m course workloads --markdown`: the committed tables are what the command prints,
from the course's code and the real tokenizer, and each workload's chapters are the ones that run it."""
from __future__ import annotations

import re

import pytest

from benchmarks.reporting import readme_block
from course.chapters import chapters
from course.paths import REPO_ROOT
from course.workloads import TEXTS, WORKLOADS, get_workload, measure
from course.workloads_page import BEGIN, END, PAGE, USES, main, markdown, write


@pytest.fixture(scope="module")
def tokenizer():
    from course.tokenizer import load_tokenizer

    return load_tokenizer()


def test_the_page_holds_what_the_command_prints(capsys):
    assert main(["--markdown"]) == 0
    printed = capsys.readouterr().out
    committed = readme_block((REPO_ROOT / PAGE).read_text(), BEGIN, END)
    assert committed == printed, f"{PAGE} is stale: run `python -m course workloads --markdown --write`"


def test_write_rewrites_only_the_block(tmp_path, tokenizer):
    page = tmp_path / PAGE
    page.write_text(f"# before\n\n{BEGIN}\nold table\n{END}\n\nafter\n")
    text = markdown(tokenizer, ["diverge"])
    write(text, page)
    assert page.read_text() == f"# before\n\n{BEGIN}\n{text}{END}\n\nafter\n"
    assert "`diverge`" in text and "`short`" not in text.split("The benches' own inputs")[0]


def test_write_needs_markdown(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--write"])
    assert e.value.code == 2


def test_every_workload_has_its_row_and_anchor(tokenizer):
    text = markdown(tokenizer)
    assert set(USES) == set(WORKLOADS), "a workload without its chapters in course/workloads_page.py"
    for name in (*WORKLOADS, "host", "random", "shared_system", "long-gpu"):
        assert f'<a id="{name}"></a>' in text, name


def _names(chapter: int, name: str) -> tuple[bool, bool]:
    """Whether chapter `chapter` names the workload in its lesson (any page: README, units, results; as `name`), and
    in its benches (as "name")."""
    folder = next(c for c in chapters() if c.startswith(f"step{chapter:02d}_"))
    lesson = any(f"`{name}`" in page.read_text() for page in (REPO_ROOT / folder).glob("*.md"))
    benches = any(f'"{name}"' in p.read_text() for p in (REPO_ROOT / "benchmarks" / f"step{chapter:02d}").glob("*.py"))
    return lesson, benches


@pytest.mark.parametrize("name", WORKLOADS)
def test_the_chapters_column_is_the_chapters_that_run_it(name):
    for chapter in USES[name]:
        assert any(_names(chapter, name)), f"chapter {chapter} does not name `{name}`, yet WORKLOADS.md lists it"
    for chapter in range(1, len(chapters()) + 1):
        if all(_names(chapter, name)):
            assert chapter in USES[name], f"chapter {chapter} runs and teaches `{name}`: list it in USES"


def test_the_long_description_is_measured(tokenizer):
    """The `long` workload's description quotes its sizes; they are the tokenizer's."""
    w = get_workload("long")
    s = measure(w, tokenizer)
    manual = len(tokenizer.encode((TEXTS / "long_reference.txt").read_text().strip()))
    numbers = re.findall(r"\d[\d,]*(?:-\d+)?", w.description)
    assert numbers == [f"{manual:,}", f"{s['requests']}", f"{s['shared_prefix']:,}", f"{s['new_min']}-{s['new_max']}"]
