"""Every page a student reads fits one sitting: at most 4,500 words (counted as `wc -w` counts, runs of
non-blank characters), and a unit's *Measured here* keeps to one table or plot and how to read it (at most 600
words). The results pages (RESULTS*.md) hold the rest of what was measured, and are pages too."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "GLOSSARY.md", ROOT / "WORKLOADS.md", ROOT / "instructors" / "README.md",
                *ROOT.glob("step0*/*.md")])
WORDS, MEASURED = 4500, 600


def words(text: str) -> int:
    return len(text.split())


def measured_here(text: str) -> str:
    """The page's `## Measured here` section, up to the next heading of its level (empty when it has none)."""
    m = re.search(r"^## Measured here.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1) if m else ""


def test_the_pages_are_found():
    assert len(PAGES) >= 30 and all(p.is_file() for p in PAGES)
    assert sum(bool(measured_here(p.read_text())) for p in PAGES) >= 17, "the units' Measured here sections"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_fits_one_sitting(page):
    n = words(page.read_text())
    assert n <= WORDS, f"{page.relative_to(ROOT)} has {n:,} words (wc -w), over {WORDS:,}: split it or say less"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_measured_here_keeps_to_one_table(page):
    n = words(measured_here(page.read_text()))
    assert n <= MEASURED, (f"{page.relative_to(ROOT)}'s Measured here has {n} words, over {MEASURED}: the rest "
                           "belongs on the chapter's results page")


def test_the_counts_are_wc_counts():
    assert words("one  two\tthree\n`four`, five-six") == 5
    assert measured_here("# T\n## Measured here\na b c\n### sub\nd\n## Next\ne f") == "\na b c\n### sub\nd\n"
