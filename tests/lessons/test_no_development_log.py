"""No development log anywhere a student reads.

A lesson (the root README, every chapter's README, units and results page, the glossary, the workloads table, every
notebook's markdown) states what is known and how to reproduce it; where something was not measured it says so in
the course's own terms. It never tells how the course was made: which session ran out of time, which run was not
repeated on which version of the code, what was tried first. Each pattern below is a phrase such sentences used,
with the reason it gives the log away. The whole text is searched, the blocks that `python -m course report
--write` generates included (their prose comes from `benchmarks/*/report.py` and the notes in `results/*.json`).
"""
from __future__ import annotations

import re

import pytest

from course.markdown import Document, documents
from course.paths import REPO_ROOT

PATTERNS: dict[str, str] = {
    r"\bnot (?:been )?re-?run\b|\bre-?run since\b": "tells which runs the course's authors did not repeat",
    r"\bran out\b(?! of (?:blocks|slots|memory))|\b(?:GPU|device) time\b": "the authors' budget, not the reader's",
    r"\bdevelopment version\b|\ban earlier version of the\b": "a version of the code the reader cannot check out",
    r"\bnot profiled in\b": "what was left undone in some run, not what is known",
    r"\bwas not found within\b": "how long someone searched, not what is known",
    r"\b(?:an earlier|this|the next|a later|the last) session\b": "the sessions that wrote the course",
    r"\bwe tried\b|\bat first we\b|\bwe first tried\b": "the authors' history of attempts",
    r"\bTODO\b|\bFIXME\b|\bXXX\b": "a note to the authors, not to the reader",
    r"\bfor now\b|\byet to be\b|\bnot yet (?:small|done|measured|rerun|fixed)\b": "promises work to come",
    r"\bha(?:s|ve) not (?:yet )?(?:been )?run on\b": "what the authors have not run yet",
    r"\bha(?:s|ve) since (?:gained|changed|been|grown|moved)\b": "the code's history since a measurement",
    r"\bthe current (?:code|kernels?|engine|version)\b": "'current' only means something against the history",
    r"\b(?:earlier|previous|later) commit\b|\bcommitted (?:before|kernel|code)\b|\bcommit [0-9a-f]{7,}\b":
        "the repository's history, which the reader does not follow",
    r"\bfrom an earlier run\b": "a run the reader has no record of; name its date and command instead",
}
LOG = re.compile("|".join(f"(?:{p})".replace(" ", r"\s+") for p in PATTERNS), re.I)  # a phrase may wrap


def test_patterns_compile_alone():
    for pattern in PATTERNS:
        re.compile(pattern)


@pytest.mark.parametrize("doc", documents(REPO_ROOT), ids=lambda d: d.path)
def test_no_development_log(doc: Document):
    hits = [f"{doc.where(m.start())}: {m[0]!r} in …{doc.text[max(0, m.start() - 60):m.end() + 60]!r}…"
            for m in LOG.finditer(doc.text)]
    assert not hits, "sentences about how the course was made, not what is known:\n" + "\n".join(hits)


@pytest.mark.parametrize("text", ["these parts have not been rerun on the current code", "GPU time ran out",
                                  "from the module's development version", "not profiled in this run",
                                  "The cause was not found within the device time", "TODO: rerun",
                                  "the committed kernel has since gained VALUE_SCALE", "From an earlier run"])
def test_the_patterns_catch_the_log(text: str):
    assert LOG.search(text)


@pytest.mark.parametrize("text", ["when the pool runs out of blocks", "the tokens not yet read",
                                  "the conversation so far", "a request longer than the budget"])
def test_the_patterns_leave_the_lessons(text: str):
    assert not LOG.search(text)
