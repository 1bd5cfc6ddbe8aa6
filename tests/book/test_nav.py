"""book.yml, the book's one navigation file, against the lesson files; and how a lesson's links are staged."""
from __future__ import annotations

import json

from tests.book.conftest import ROOT


def test_every_lesson_file_is_in_the_nav_and_every_entry_exists(builder):
    problems = builder.nav_problems(ROOT)
    assert not problems, "book.yml and the lesson files disagree:\n" + "\n".join(problems)


def test_each_chapter_lists_its_readme_first_and_its_notebook(builder):
    book = builder.load_book(ROOT)
    chapters = {pages[0].split("/")[0]: pages for _, pages in book.chapters if pages[0].startswith("step")}
    assert chapters, "book.yml lists no chapter"
    for folder, pages in chapters.items():
        assert pages[0] == f"{folder}/README.md", f"{folder}: a chapter opens with its README, not {pages[0]}"
        number = folder[len("step"):len("step") + 2]
        assert any(p.startswith(f"notebooks/{number}_") for p in pages), f"{folder}: its notebook is not listed"


def _tree(tmp_path, files: dict[str, str]):
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return tmp_path


def test_the_nav_check_names_a_missing_unit_and_a_missing_entry(builder, tmp_path):
    root = _tree(tmp_path, {
        "book.yml": "site_name: t\nnav:\n  - README.md\n  - Ch 1:\n      - step01_a/README.md\n"
                    "      - step01_a/gone.md\nnot_in_book:\n  - instructors/**\n",
        "README.md": "# t\n", "step01_a/README.md": "# a\n", "step01_a/unit2.md": "# unit 2\n",
        "instructors/key.md": "# key\n", "notebooks/01_a.ipynb": "{}",
    })
    problems = builder.nav_problems(root)
    assert any("step01_a/unit2.md" in p and "does not list it" in p for p in problems), problems
    assert any("notebooks/01_a.ipynb" in p for p in problems), problems
    assert any("step01_a/gone.md" in p and "does not exist" in p for p in problems), problems
    assert not any("instructors" in p for p in problems), problems


def test_links_are_staged_so_that_they_work_on_the_site(builder, tmp_path):
    root = _tree(tmp_path / "repo", {
        "book.yml": "site_name: t\nnav:\n  - README.md\n  - Ch 1:\n      - step01_a/README.md\n"
                    "      - notebooks/01_a.ipynb\n",
        "README.md": "# t\n[chapter](step01_a/README.md#theory) and [the tests](tests/step01/)\n",
        "step01_a/README.md": "# a\nSee [`model.py`](model.py), ![a figure](figures/f.svg), "
                              "[`x`](missing.py)\n```python\nblocks[0](model.py)\n```\n",
        "step01_a/model.py": "def f():\n    return '```'\n",
        "step01_a/figures/f.svg": "<svg xmlns='http://www.w3.org/2000/svg'/>",
        "tests/step01/test_a.py": "def test_a():\n    pass\n",
        "notebooks/01_a.ipynb": json.dumps({"cells": [{"cell_type": "markdown", "metadata": {},
                                                       "source": ["[the lesson](../step01_a/README.md#code)"]}],
                                            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}),
    })
    docs = tmp_path / "docs"
    stager = builder.Stager(root, docs, builder.load_book(root)).run()
    page = (docs / "step01_a/README.md").read_text()
    assert "](../code/step01_a/model.py.md)" in page  # source files become code pages
    assert "](figures/f.svg)" in page and (docs / "step01_a/figures/f.svg").is_file()
    assert "blocks[0](model.py)" in page  # code blocks are left alone
    assert "```python\ndef f():" in (docs / "code/step01_a/model.py.md").read_text().replace("````", "```")
    assert "# `step01_a/model.py`\n\n````python" in (docs / "code/step01_a/model.py.md").read_text()
    home = (docs / "README.md").read_text()
    assert "](step01_a/README.md#theory)" in home and "](code/tests/step01/index.md)" in home
    assert "](test_a.py.md)" in (docs / "code/tests/step01/index.md").read_text()
    notebook = json.loads((docs / "notebooks/01_a.ipynb").read_text())
    assert notebook["cells"][0]["source"] == "[the lesson](../step01_a/index.html#code)"  # notebooks link HTML
    assert stager.problems == ["step01_a/README.md: link to missing.py, which does not exist"]


def test_github_markdown_is_normalised_for_python_markdown(builder):
    text = "**You can:**\n- one\n  - nested\n- two\n\nText\n| a | b |\n|---|---|\n```\n- not a list\n```\n"
    out = builder.normalise_markdown(text)
    assert "**You can:**\n\n- one\n    - nested\n- two\n" in out
    assert "Text\n\n| a | b |" in out
    assert "```\n- not a list\n```" in out
    assert builder.page_url("README.md") == "index.html"
    assert builder.page_url("step01_a/README.md") == "step01_a/index.html"
    assert builder.page_url("notebooks/01_a.ipynb") == "notebooks/01_a.html"
