"""The lessons' markdown as a reader meets it: what is prose, what is code, where its links lead.

A README or a notebook's markdown is read in one of three ways here:

- `prose(text)`: the text with everything that is not prose blanked out (each character but newlines turned into
  a space, so offsets and line numbers stay those of the file): fenced code blocks, inline `code` spans, HTML
  comments, the blocks that `python -m course report --write` and the chapters' report commands generate
  between `<!-- NAME:begin (...) -->` and `<!-- NAME:end -->`, and the targets of links and images (their
  text stays: it is read). Hand-typed tables are prose.
- `code_parts(text)`: the code a reader sees in the markdown: fenced blocks and inline spans.
- `links(text)`: the targets of its links and images, outside code.

`documents(root)` lists the lessons (the root README, every chapter's README, every notebook's markdown cells) as
`Document`s, which know how to name a place in them (`file:line`, or a notebook's cell and line).
The reference pages that every lesson links to, the glossary and the table of workloads (`REFERENCE`), are
documents too.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

GENERATED = re.compile(r"<!-- ([\w-]+):begin \([^)]*\) -->.*?<!-- \1:end -->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"(!?\[(?:[^\]\[]|\[[^\]]*\])*\])\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = ("GLOSSARY.md", "WORKLOADS.md")  # pages at the root that the lessons link to for their terms


def _blank(s: str) -> str:
    return re.sub(r"[^\n]", " ", s)


def _fences(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of every fenced code block, fences included (an unclosed one runs to the end)."""
    spans, start, opener, offset = [], None, "", 0
    for line in text.splitlines(keepends=True):
        m = FENCE.match(line)
        if start is None and m:
            start, opener = offset, m[1]
        elif start is not None and m and m[1][0] == opener[0] and len(m[1]) >= len(opener) \
                and not line.strip()[len(m[1]):]:
            spans.append((start, offset + len(line)))
            start = None
        offset += len(line)
    if start is not None:
        spans.append((start, len(text)))
    return spans


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    out, last = [], 0
    for a, b in sorted(spans):
        if a < last:
            continue
        out += [text[last:a], _blank(text[a:b])]
        last = b
    return "".join(out) + text[last:]


def without_code(text: str) -> str:
    """`text` with fenced blocks, HTML comments and generated blocks blanked (inline spans kept)."""
    text = GENERATED.sub(lambda m: _blank(m[0]), text)
    text = COMMENT.sub(lambda m: _blank(m[0]), text)
    return _cut(text, _fences(text))


def prose(text: str) -> str:
    """The prose of a markdown text, same length and lines: see the module docstring for what is blanked."""
    text = without_code(text)
    text = SPAN.sub(lambda m: _blank(m[0]), text)
    return LINK.sub(lambda m: m[1] + "(" + _blank(m[0][len(m[1]) + 1:-1]) + ")", text)


def code_parts(text: str) -> Iterator[tuple[int, str]]:
    """(offset, code) of every fenced block (its lines inside the fences) and inline code span of a markdown
    text; HTML comments are not read."""
    text = COMMENT.sub(lambda m: _blank(m[0]), text)
    fences = _fences(text)
    for a, b in fences:
        body = text[a:b].split("\n", 1)
        inner = body[1] if len(body) > 1 else ""
        inner = re.sub(r"\n?[ ]{0,3}(`{3,}|~{3,})[ \t]*\n?$", "", inner)
        yield a + len(body[0]) + 1, inner
    for m in SPAN.finditer(_cut(text, fences)):
        yield m.start(2), m[2]


def links(text: str) -> Iterator[tuple[int, str]]:
    """(offset, target) of every link and image outside code (fenced blocks, spans, comments)."""
    text = SPAN.sub(lambda m: _blank(m[0]), without_code(text))
    for m in LINK.finditer(text):
        if m[2]:
            yield m.start(2), m[2]


def is_local(target: str) -> bool:
    """A link into the repository (not a URL, not an anchor of the same page)."""
    return not re.match(r"[a-zA-Z][\w+.-]*:", target) and not target.startswith(("#", "//"))


@dataclass
class Document:
    """A lesson's markdown: `text` is what a reader reads (a notebook's markdown cells, joined by a blank line,
    each at a known offset); `where(offset)` names the place as `file:line` or `file cell N, line L`."""

    path: str
    text: str
    cells: list[tuple[int, int]] = field(default_factory=list)  # (offset in text, cell number), notebooks only

    def where(self, offset: int) -> str:
        if not self.cells:
            return f"{self.path}:{self.text.count(chr(10), 0, offset) + 1}"
        start, number = max((c for c in self.cells if c[0] <= offset), default=self.cells[0])
        return f"{self.path} cell {number}, line {self.text.count(chr(10), start, offset) + 1}"


def notebook_cells(text: str, kinds: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    """(number, source) of a notebook's cells of `kinds` ("markdown", "code"), numbered from 1 as Jupyter shows
    them. Text that is not a notebook's JSON raises: a lesson or a release it cannot read must not pass a check
    unread."""
    for number, cell in enumerate(json.loads(text)["cells"], 1):
        if cell.get("cell_type") in kinds:
            source = cell.get("source", "")
            yield number, "".join(source) if isinstance(source, list) else source


def notebook(path: Path, relative: str, kinds: tuple[str, ...] = ("markdown",)) -> Document:
    """The cells of `kinds` of a notebook as one Document."""
    parts, cells, offset = [], [], 0
    for number, source in notebook_cells(path.read_text(), kinds):
        cells.append((offset, number))
        parts.append(source)
        offset += len(source) + 2
    return Document(relative, "\n\n".join(parts), cells)


def documents(root: Path) -> list[Document]:
    """The lessons: the root README, each chapter's pages (its README, its units, its results page), each notebook's
    markdown cells."""
    readmes = [root / "README.md"]
    for chapter in sorted(root.glob("step[0-9][0-9]_*/README.md")):
        readmes += [chapter, *sorted(p for p in chapter.parent.glob("*.md") if p != chapter)]
    readmes += [root / name for name in REFERENCE]
    out = [Document(str(p.relative_to(root)), p.read_text()) for p in readmes if p.is_file()]
    out += [notebook(p, str(p.relative_to(root))) for p in sorted((root / "notebooks").glob("*.ipynb"))]
    return out
