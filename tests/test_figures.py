"""The lessons' pictures come from code: each chapter's `pictures.lesson_figures()` must draw exactly the committed
`figures/NAME.dot`, every .dot has its rendered .svg, and each README shows at least one of its chapter's figures.
No graphviz needed: DOT text is compared, never SVG. In a student edition the code that draws is a stub until
solved, so there the committed figures (the reference's) are not compared."""
from __future__ import annotations

import re

import pytest

from course import figures
from course import homework_tool as hw
from course.chapters import chapters

CHAPTERS = chapters()
STUBBED = [chapter for chapter in CHAPTERS if hw.stubbed_tasks(chapter)]
IMAGE = re.compile(r"!\[[^\]]+\]\(figures/([\w.-]+\.svg)\)")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_committed_figures_are_what_the_code_draws(chapter):
    unsolved = [c for c in STUBBED if c <= chapter]  # a chapter's figures run its code and the chapters before
    if unsolved:
        pytest.skip(f"{unsolved[0]} is stubbed (a student edition): its code cannot draw the reference's figures")
    assert figures.lesson_figures(chapter), f"{chapter}/pictures.py has no lesson_figures()"
    problems = figures.stale(chapter)
    assert not problems, "\n".join(problems) + "\nrun `make figures` and commit stepNN_x/figures/"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_figure_has_its_svg(chapter):
    dots = sorted(figures.figures_dir(chapter).glob("*.dot"))
    missing = [p.name for p in dots if not p.with_suffix(".svg").is_file()]
    assert not missing, f"{chapter}/figures: no .svg beside {missing}: run `make figures` (needs graphviz's `dot`)"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_readme_shows_its_figures(chapter):
    folder = figures.figures_dir(chapter)
    shown = IMAGE.findall((folder.parent / "README.md").read_text())
    assert shown, f"{chapter}/README.md shows none of its figures: add ![what it shows](figures/NAME.svg)"
    missing = [name for name in shown if not (folder / name).is_file()]
    assert not missing, f"{chapter}/README.md shows figures/{missing[0]}, which does not exist: run `make figures`"
