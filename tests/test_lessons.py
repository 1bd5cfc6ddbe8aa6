"""The lessons as a reader meets them: links that lead somewhere, a homework table that says what the markers
say, a notebook and papers named in every chapter, the sources introduced once, and none of the tracker's
vocabulary in what students read."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course.chapters import chapters
from course.homework_tool import find_tasks, task_points

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = chapters()
SOURCES = ("the Pico-vLLM prefix-caching write-up", "the mini-runtime textbook, chapter 13",
           "the mini-vllm tutorial's Paged Prefix Cache chapter")


def readmes() -> list[Path]:
    return [ROOT / "README.md"] + [ROOT / c / "README.md" for c in CHAPTERS]


def notebook_text(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells)


def section(text: str, heading: str) -> str:
    """The body of `## heading` up to the next heading of the same level."""
    part = text.split(f"\n## {heading}\n", 1)
    assert len(part) == 2, f"no '## {heading}' section"
    return part[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("path", readmes(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files(path: Path):
    text = path.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        assert (path.parent / target.split("#", 1)[0]).exists(), f"{path.name}: broken link {target}"


FORBIDDEN = [r"\bseed 0\d\d\b", r"\bbug \d", r"\bissue \d+", r"\bgoals?\b"]


@pytest.mark.parametrize("path", readmes() + sorted((ROOT / "notebooks").glob("*.ipynb")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_tracker_vocabulary(path: Path):
    """Readers never see the course's source folder or its tracker: sources are cited by name, targets are
    targets."""
    text = notebook_text(path) if path.suffix == ".ipynb" else path.read_text()
    for pattern in FORBIDDEN:
        hit = re.search(pattern, text, re.I)
        assert hit is None, f"{path.name}: {hit.group(0)!r} near {text[max(0, hit.start() - 60):hit.end() + 20]!r}"


def test_test_names_use_no_tracker_vocabulary():
    names = [m for f in (ROOT / "tests").rglob("test_*.py") for m in re.findall(r"def (test_\w+)", f.read_text())]
    assert names and not [n for n in names if re.search(r"seed_?0\d\d|bug_?\d|issue_?\d|goal", n)]


@pytest.mark.parametrize("package", CHAPTERS)
def test_homework_table_says_what_the_markers_say(package: str):
    """Every task of the chapter is in its README's table with the points its markers give, and nothing else."""
    rows = re.findall(r"^\| `(task\d+\.\w+)` \| (\d+) \|", (ROOT / package / "README.md").read_text(), re.M)
    assert {t: int(p) for t, p in rows} == task_points(find_tasks(package.split("_")[0])), package
    assert len(rows) == len(dict(rows)), f"{package}: a task is listed twice"


@pytest.mark.parametrize("package", CHAPTERS)
def test_each_chapter_links_its_notebook_and_cites_papers(package: str):
    text = (ROOT / package / "README.md").read_text()
    number = package[4:6]
    notebooks = list((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
    assert notebooks, f"no notebook for {package}"
    assert f"(../notebooks/{notebooks[0].name})" in text, f"{package} does not link {notebooks[0].name}"
    reading = section(text, "Further reading")
    assert re.search(r"arXiv:\d{4}\.\d{4,5}\b", reading), f"{package}: Further reading names no arXiv paper"
    assert not re.search(r"arXiv:(?!\d{4}\.\d{4,5}\b)", reading), f"{package}: a malformed arXiv number"


def test_sources_are_introduced_once_in_the_root_readme():
    sources = section((ROOT / "README.md").read_text(), "Sources")
    for name in SOURCES:
        assert name in sources, f"the Sources section does not introduce {name!r}"
    used = {name: [c for c in CHAPTERS if name.split(",")[0].lower() in (ROOT / c / "README.md").read_text().lower()]
            for name in SOURCES}
    assert all(used.values()), f"a source no chapter cites: {used}"
