"""Terms before use: in every lesson (README, unit, results page, notebook markdown), the first prose use of a
glossary term and of a workload's name is a link to its entry in GLOSSARY.md or WORKLOADS.md.

A heading or a picture's description is not a use: the first use is the first one a reader meets in the text.
Generated blocks, fenced code and HTML comments are not read; a workload's name counts where it is written as
`name` (in backticks), a term where its words are prose (inline code is a name of the code, not the term).
"""
from __future__ import annotations

import posixpath
import re

import pytest

from course.markdown import LINK, REFERENCE, SPAN, Document, _blank, documents, without_code
from course.paths import REPO_ROOT
from course.workloads import WORKLOADS

# Lessons still being rewritten by their owners, who link them when they land and then remove them from this set.
PENDING: set[str] = set()

# glossary anchor -> the words that use the term (matched ignoring case unless the pattern has a capital letter)
TERMS = {
    "kv-cache": r"\bKV[- ]cache\b(?! events?)",
    "prefill": r"(?<!chunked )\bprefill(?:s|ed|ing)?\b",
    "decode": r"(?<!-)\bdecodes?\b",  # not spec-decode, nor decoded text
    "gqa": r"\bGQA\b|\b[Gg]rouped-query\b",
    "ttft": r"\bTTFT\b|\b[Tt]ime[- ]to[- ]first[- ]token\b",
    "itl-and-tpot": r"\bITL\b|\bTPOT\b|\b[Ii]nter-token latency\b",
    "kv-pool": r"(?<!-)\bKV pool",  # not SGLang's token-to-KV pool
    "block-table": r"\bblock[- ]tables?\b",
    "slot-mapping": r"\bslot mapping\b",
    "paged-attention": r"\bpaged attention\b",
    "fragmentation": r"\bfragmentation\b",
    "continuous-batching": r"\bcontinuous[- ]batch(?:ing|es)?\b",
    "token-budget": r"\btoken budget\b",
    "chunked-prefill": r"\bchunked prefill\b",
    "preemption": r"\bpreempt(?:ion|s|ed|ing)?\b",
    "reference-count": r"\b(?:reference|ref)[- ]counts?\b|\brefcounts?\b",
    "prefix-cache": r"(?<!Paged )\bprefix[- ]cach(?:e|es|ing)\b(?! write-up)",  # not a source's title
    "block-hash": r"\bblock hash(?:es)?\b|\bchained hash(?:es)?\b",
    "hit-rate": r"\bhit rates?\b",
    "radix-tree": r"\bradix trees?\b",
    "eviction": r"\bevict(?:ion|ions|s|ed|ing)?\b",
    "lru": r"\bLRU\b",
    "cache-aware-scheduling": r"\bcache-aware scheduling\b",
    "host-tier": r"\bhost tier\b",
    "speculative-decoding": r"\bspeculative decoding\b",
    "prompt-lookup": r"\bprompt lookup\b",
    "split-kv": r"\b[Ss]plit-KV\b",
    "cascade-attention": r"\bcascade attention\b",
    "fp8-kv-cache": r"\bFP8\b",
    "cuda-graphs": r"\bCUDA[- ]graphs?\b",
    "overlap-scheduling": r"\boverlap(?:ped)? scheduling\b",
    "kv-events": r"\bKV(?:-cache)? events?\b",
    "cache-aware-routing": r"\bcache-aware rout(?:ing|er|ers)\b",
}
# workload name -> its anchor in WORKLOADS.md: the text workloads and the GPU's `shared_system` (`random` is also
# SGLang's policy and Python's module, so a lesson links that workload by hand)
NAMES = {**{name: name for name in WORKLOADS}, "shared_system": "shared_system"}


def _compile(pattern: str) -> re.Pattern:
    return re.compile(pattern, 0 if re.search(r"[A-Z]", pattern.replace(r"\b", "")) else re.I)


PATTERNS = {anchor: _compile(p) for anchor, p in TERMS.items()}


def _pending(path: str) -> bool:
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in PENDING)


def lessons() -> list[Document]:
    return [d for d in documents(REPO_ROOT) if d.path not in REFERENCE]


def _readable(text: str) -> str:
    """The text with what is not read as prose blanked (code blocks, comments, generated blocks, headings, pictures),
    inline code and link texts kept."""
    text = without_code(text)  # fenced code, comments, generated blocks
    text = re.sub(r"^ {0,3}#.*$", lambda m: _blank(m[0]), text, flags=re.M)  # headings
    return re.sub(r"!\[(?:[^\]\[]|\[[^\]]*\])*\]\([^)]*\)", lambda m: _blank(m[0]), text)  # pictures


def _links(doc: Document, text: str) -> list[tuple[int, int, str]]:
    """(start, end, target relative to the repository) of each link's text."""
    folder = posixpath.dirname(doc.path)
    out = []
    for m in LINK.finditer(text):
        path, _, anchor = m[2].partition("#")
        target = posixpath.normpath(posixpath.join(folder, path)) if path else doc.path
        out.append((m.start(1), m.end(1), f"{target}#{anchor}"))
    return out


def first_uses(doc: Document) -> list[tuple[int, int, str, str]]:
    """(start, end, page#anchor it must link to, the words) of the first use of every term and workload name."""
    readable = _readable(doc.text)
    prose = SPAN.sub(lambda m: _blank(m[0]), readable)  # terms: inline code is not the term
    prose = LINK.sub(lambda m: m[1] + _blank(m[0][len(m[1]):]), prose)  # nor is a link's target
    uses = []
    for anchor, pattern in PATTERNS.items():
        m = pattern.search(prose)
        if m:
            uses.append((m.start(), m.end(), f"GLOSSARY.md#{anchor}", m[0]))
    names = LINK.sub(lambda m: m[1] + _blank(m[0][len(m[1]):]), readable)
    for name, anchor in NAMES.items():
        m = re.search(rf"`{name}`", names)
        if m:
            uses.append((m.start(), m.end(), f"WORKLOADS.md#{anchor}", m[0]))
    return sorted(uses)


def unlinked(doc: Document) -> list[str]:
    """Each first use that is not inside a link to its entry, named by place."""
    links = _links(doc, _readable(doc.text))
    out = []
    for start, end, target, words in first_uses(doc):
        if not any(a <= start and end <= b and t == target for a, b, t in links):
            out.append(f"{doc.where(start)}: {words!r} should link to {target}")
    return out


@pytest.mark.parametrize("doc", [d for d in lessons() if not _pending(d.path)], ids=lambda d: d.path)
def test_the_first_use_of_each_term_links_to_its_entry(doc: Document):
    missing = unlinked(doc)
    assert not missing, "a term or a workload before its link:\n" + "\n".join(missing)


def test_every_anchor_exists():
    """The anchors the test expects are the glossary's headings and the workloads page's ids."""
    from course.workloads_page import BEGIN, END

    glossary = (REPO_ROOT / "GLOSSARY.md").read_text()
    headings = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-")
                for h in re.findall(r"^#{2,3} (.+)$", glossary, re.M)}
    assert set(TERMS) <= headings, f"no glossary entry for {set(TERMS) - headings}"
    page = (REPO_ROOT / "WORKLOADS.md").read_text()
    block = page[page.index(BEGIN):page.index(END)]
    assert all(f'<a id="{a}"></a>' in block for a in NAMES.values())


def test_pending_names_lessons_that_exist():
    paths = [d.path for d in documents(REPO_ROOT)]
    assert all(any(p == k or (k.endswith("/") and p.startswith(k)) for p in paths) for k in PENDING), PENDING


def test_the_check_finds_an_unlinked_first_use():
    doc = Document("step09_x/README.md", "# TTFT\n\nThe `short` workload's TTFT, then [TTFT](../GLOSSARY.md#ttft).\n"
                                         "[`diverge`](../WORKLOADS.md#diverge) ![TTFT](f.svg)\n")
    assert unlinked(doc) == ["step09_x/README.md:3: '`short`' should link to WORKLOADS.md#short",
                             "step09_x/README.md:3: 'TTFT' should link to GLOSSARY.md#ttft"]
