"""The built website: every internal link and picture resolves, nothing comes from the network, every page of
book.yml is there with its pictures and is found by the search index."""
from __future__ import annotations

import json
import re
import time
import warnings
from types import SimpleNamespace

import pytest

from tests.book.conftest import ROOT

# Broken links the book reports but cannot fix, each with where it comes from. The test fails on any other broken
# link, and on an entry here that no longer happens (delete it then).
KNOWN_BROKEN = {
    "notebooks/06_triton.html: resource results/timeline.svg leads nowhere":
        "notebook 6 prints chapter 6's engine tables, whose picture link is relative to the chapter's README",
}


@pytest.fixture(scope="module")
def site(builder):
    start = time.perf_counter()
    stager = builder.build(ROOT, builder.OUT, quiet=True)
    return SimpleNamespace(path=builder.OUT / "site", stager=stager, seconds=time.perf_counter() - start)


def test_the_site_builds_in_bounded_time(site):
    assert (site.path / "index.html").is_file()
    assert site.seconds < 60, f"make book took {site.seconds:.0f} s"


def test_every_internal_link_and_picture_resolves(builder, site):
    problems = site.stager.problems + builder.check_site(site.path)
    broken = [p for p in problems if p not in KNOWN_BROKEN]
    assert not broken, f"{len(broken)} broken links or pictures:\n" + "\n".join(broken)
    fixed = [p for p in KNOWN_BROKEN if p not in problems]
    assert not fixed, "fixed, so delete from KNOWN_BROKEN:\n" + "\n".join(fixed)
    for problem in KNOWN_BROKEN:
        warnings.warn(f"known broken link: {problem} ({KNOWN_BROKEN[problem]})", stacklevel=1)


def test_the_link_check_finds_a_broken_link_an_anchor_and_a_remote_script(builder, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text('<h2 id="here">x</h2><a href="a/b.html#there">b</a><a href="#here">h</a>'
                                         '<a href="https://example.org/">fine: a link out</a>'
                                         '<img src="gone.svg"><script src="https://cdn.example.org/x.js"></script>')
    (tmp_path / "a" / "b.html").write_text('<a href="../index.html#here">back</a><a href="../">home</a>')
    assert builder.check_site(tmp_path) == [
        "index.html: link a/b.html#there: a/b.html has no #there",
        "index.html: resource gone.svg leads nowhere",
        "index.html: loads https://cdn.example.org/x.js from the network",
    ]


def test_nothing_is_fetched_from_the_network(site):
    remote = re.compile(r"@import\s+(url\()?[\"']?https?:|url\([\"']?https?:|fonts\.googleapis|fonts\.gstatic")
    offenders = [p.relative_to(site.path).as_posix() for p in site.path.rglob("*")
                 if p.suffix in (".html", ".css") and remote.search(p.read_text(errors="replace"))]
    assert not offenders, f"these files load fonts or styles from the network: {offenders}"


def test_every_page_is_built_and_searchable(builder, site):
    book = builder.load_book(ROOT)
    index = json.loads((site.path / "search" / "search_index.json").read_text())
    searchable = {doc["location"].split("#")[0] for doc in index["docs"]}
    for page in book.pages:
        url = builder.page_url(page)
        assert (site.path / url).is_file(), f"{page} was not built into {url}"
        assert url in searchable or (url == "index.html" and "" in searchable), f"{url} is not in the search index"


def test_notebooks_show_their_committed_outputs(builder, site):
    for page in builder.load_book(ROOT).pages:
        if not page.endswith(".ipynb"):
            continue
        nb = json.loads((ROOT / page).read_text())
        pictures = sum(1 for cell in nb["cells"] for out in cell.get("outputs", [])
                       if {"image/png", "image/svg+xml"} & set(out.get("data", {})))
        html = (site.path / builder.page_url(page)).read_text()
        shown = html.count("data:image/png") + html.count("<svg")
        assert shown >= pictures, f"{page}: {pictures} pictures in its outputs, {shown} on its page"
        assert "jp-OutputArea" in html, f"{page}: no output cells on its page"
