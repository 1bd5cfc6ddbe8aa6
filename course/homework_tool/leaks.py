"""Solutions that leak into a student release: a task's reference body standing anywhere outside its stub.

Three searches, all run by `release` on what it is about to write (before anything is written):

- text: a line of a reference body (whitespace aside) in any text file: READMEs, notebooks, docstrings, code;
- shape: a reference body's syntax tree with its names erased, in any Python source of the release (and the
  code cells of its notebooks): a copy with renamed variables, or `bm = self.block_manager` in front;
- prose: an expression of a reference body written out in the lessons' markdown (every `.md` file, and the
  markdown and code cells of the notebooks), in a sentence, an inline `code` span or a fenced block, with its
  names and numbers erased and its operators read as Python's (`−` is `-`, `×` is `*`): the formula of a
  task, `end // B − start // B`, stated in a README.

A copy found means the later code should call the task's function instead of restating it, and a lesson
should say what to compute, not the expression that computes it.

A fourth search, `instructor_leaks`, looks for the instructors' text: a clause of an answer key or a rubric
(instructors/answers/, instructors/rubrics/) quoted anywhere in the release.
"""
from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from ..markdown import notebook_cells
from ..paths import REPO_ROOT
from .markers import Region, is_stub
from .tasks import find_tasks, select_chapters
from .written import plain, questions


class Leak(NamedTuple):
    """`task`'s solution at line `line` of `file` (relative to the release); `what` says which part and why."""

    file: str
    line: int
    task: str
    what: str


def _solutions(root: Path, chapters: Iterable[str] | None) -> Iterator[tuple[Region, str]]:
    """Every reference body (not a stub) of the chapters' tasks, with the text of its file."""
    for package in select_chapters(chapters, root):
        for regions in find_tasks(package, root).values():
            for r in regions:
                source = (root / r.file).read_text()
                if not is_stub(source, r):
                    yield r, source


# ---------------------------------------------------------------- text: a body's lines, whitespace aside


def _normal(line: str) -> str:
    """A line without its whitespace (and without a trailing comment): what the text search compares."""
    code = line if line.lstrip().startswith("#") else line.split("  #")[0]
    return "".join(code.split())


def solution_bodies(root: Path | None = None, chapters: Iterable[str] | None = None) -> dict[str, list[list[str]]]:
    """Task -> the normalized non-blank lines of each of its reference bodies."""
    root = (root or REPO_ROOT).resolve()
    out: dict[str, list[list[str]]] = {}
    for r, source in _solutions(root, chapters):
        body = [n for n in map(_normal, source.splitlines()[r.begin:r.end - 1]) if n]
        if body:
            out.setdefault(r.task, []).append(body)
    return out


LONG_LINE = 30  # characters (whitespace removed): one such line of a solution is a leak on its own
PAIR_LINE = 14  # two consecutive lines of a solution, each this long at least, are a leak together


def text_leaks(texts: Mapping[str, str], bodies: dict[str, list[list[str]]]) -> list[Leak]:
    """Every place in `texts` (file -> text) that holds a line of `bodies` of LONG_LINE+ characters, or two
    consecutive PAIR_LINE+ lines of one body, whitespace ignored.

    Short lines (`for b in blocks:`, `node = node.parent`) are idioms any code has, not answers."""
    long_lines = {line: task for task, bs in bodies.items() for body in bs for line in body if len(line) >= LONG_LINE}
    pairs = {(a, b): task for task, bs in bodies.items() for body in bs for a, b in zip(body, body[1:])
             if min(len(a), len(b)) >= PAIR_LINE}
    found = []
    for where, text in sorted(texts.items()):
        lines = [(n, line) for n, line in enumerate(map(_normal, text.splitlines()), 1) if line]
        for (n, line), (_, following) in zip(lines, lines[1:] + [(0, "")]):
            for solution, task in long_lines.items():
                if solution in line:
                    found.append(Leak(where, n, task, solution))
            if (line, following) in pairs:
                found.append(Leak(where, n, pairs[line, following], f"{line} / {following}"))
    return found


# ---------------------------------------------------------------- shape: a body's syntax tree, names erased

MIN_NODES = 12
"""No part smaller than this many syntax nodes is searched for (nodes as `_Shapes` counts them: a dotted name,
a constant or an f-string is one node), so a body smaller than this is not searched for at all.

`return x` is 2 nodes, `total += i` 4, `if n > limit: raise ValueError(f"...")` 9, `for b in blocks: f(b)` 7:
below a dozen nodes a piece of code is an idiom that any code repeats, and finding its shape elsewhere says
nothing. (In this course's own code, for each size from 10 to 15 nodes, about a hundred distinct statement
runs of that size stand in two places or more.) Every task body here is larger except task5.span's, 11 nodes:
a one-line tree walk that is its own idiom, guarded by its tests, not by this search."""

SHARE = 0.5
KEY_NODES = 20
"""A part of a body (a run of its statements, or one expression of it) found elsewhere is a leak when it holds
at least SHARE of the body's nodes, or KEY_NODES nodes (and MIN_NODES in both cases): half a task's body gives
the task away, and so does a key formula of a large body, such as task2.allocate_slots's
`max(0, cdiv(computed + n, B) - len(table) - len(hits))` (20 nodes; restated in chapters 3 and 5 before they
called `blocks_needed`, in 20-28-node parts that this search finds). One shared idiom (an all-or-nothing check,
`seq.block_table += bm.allocate(need)`, a block's slice `tokens[i * bs: (i + 1) * bs]`) stays below: the largest
part of a task body that this course repeats outside its stubs is 16 nodes."""


class _Shapes:
    """The shape of statements and expressions: node types and structure, with names, attribute names and
    constants' values erased. A dotted name (`x`, `self.pool`, `self.pool.free`) is one leaf, so an alias
    (`bm = self.block_manager`, then `bm.allocate`) does not hide a copy; a constant keeps its type; an f-string
    is a message, a leaf like a constant string. Shapes are memoized per node (a tree is walked once)."""

    def __init__(self) -> None:
        self.memo: dict[ast.AST, tuple[str, int]] = {}  # node -> (shape, size in nodes)

    def of(self, node: ast.AST) -> tuple[str, int]:
        if node not in self.memo:
            self.memo[node] = self._compute(node)
        return self.memo[node]

    def _compute(self, node: ast.AST) -> tuple[str, int]:
        if _dotted(node):
            return "N", 1
        if isinstance(node, ast.Constant):
            return f"C{type(node.value).__name__}", 1
        if isinstance(node, ast.JoinedStr):
            return "Cstr", 1
        parts, size = [type(node).__name__], 1
        for name, value in ast.iter_fields(node):
            children = [c for c in (value if isinstance(value, list) else [value])
                        if isinstance(c, ast.AST) and not isinstance(c, ast.expr_context)]
            if children:  # a field of names (`id`, `attr`, `arg`), `level` or `type_comment` is erased
                shapes = [self.of(c) for c in children]
                parts.append(f"{name}=[{','.join(s for s, _ in shapes)}]")
                size += sum(n for _, n in shapes)
        return f"({' '.join(parts)})", size

    def part(self, part: list[ast.stmt] | ast.expr) -> tuple[str, int]:
        """The shape and size of a run of statements, or of one expression."""
        if not isinstance(part, list):
            return self.of(part)
        shapes = [self.of(s) for s in part]
        return ";".join(s for s, _ in shapes), sum(n for _, n in shapes)


def _dotted(node: ast.AST) -> bool:
    """`x`, `self.x`, `self.x.y`: a reference, whatever it is called."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _statement_lists(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every list of statements in `tree` (module, function, loop and branch bodies), outermost first."""
    for node in ast.walk(tree):
        for value in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                yield value


def _parts(statements: list[ast.stmt], longest: int | None = None
           ) -> Iterator[tuple[int, int, list[ast.stmt] | ast.expr]]:
    """(first line, last line, part) of every run of consecutive statements (`longest` at most) in every
    statement list of `statements` (nested ones included), and of every expression in them."""
    module = ast.Module(body=statements, type_ignores=[])
    for body in _statement_lists(module):
        for i in range(len(body)):
            for j in range(i + 1, min(len(body), i + (longest or len(body))) + 1):
                yield body[i].lineno, body[j - 1].end_lineno or body[j - 1].lineno, body[i:j]
    for node in ast.walk(module):
        if isinstance(node, ast.expr):
            yield node.lineno, node.end_lineno or node.lineno, node


class Solution(NamedTuple):
    """A reference body: where it is, its size in nodes, its parts worth searching for (shape -> size) and
    the most statements one of those parts runs over."""

    region: Region
    size: int
    parts: dict[str, int]
    longest: int


def searched_size(size: int) -> int:
    """The least size of a part of a `size`-node body that is searched for (see MIN_NODES, SHARE, KEY_NODES)."""
    return max(MIN_NODES, min(KEY_NODES, math.ceil(SHARE * size)))


def solution_shapes(root: Path | None = None, chapters: Iterable[str] | None = None) -> list[Solution]:
    """The reference bodies of the chapters' tasks, each with the shapes of its parts worth searching for."""
    root = (root or REPO_ROOT).resolve()
    out = []
    for r, source in _solutions(root, chapters):
        tree = ast.parse(source, str(r.file))
        inside = next(([s for s in body if r.begin < s.lineno and (s.end_lineno or s.lineno) < r.end]
                       for body in _statement_lists(tree) if any(r.begin < s.lineno < r.end for s in body)), [])
        shapes = _Shapes()
        _, size = shapes.part(inside)
        parts, longest = {}, 0
        for _, _, part in _parts(inside):
            shape, n = shapes.part(part)
            if n >= searched_size(size):
                parts[shape] = n
                longest = max(longest, len(part) if isinstance(part, list) else 1)
        out.append(Solution(r, size, parts, longest))
    return out


def python_sources(files: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(file, code) of every Python source in `files`: .py files, and notebooks' code cells (named
    `NOTEBOOK (code cell N)`, their lines counted from the cell's first)."""
    for where, text in sorted(files.items()):
        if where.endswith(".py"):
            yield where, text
        elif where.endswith(".ipynb"):
            for i, source in notebook_cells(text, ("code",)):
                yield f"{where} (code cell {i})", source


def shape_leaks(files: Mapping[str, str], solutions: list[Solution]) -> list[Leak]:
    """Every place in the Python sources of `files` (file -> text) whose syntax tree, names erased, is a
    searched part of one of `solutions`. Of the parts of one task found at overlapping places, the report
    names the outermost (the longest copy), once."""
    wanted: dict[str, list[tuple[Solution, int]]] = {}
    for solution in solutions:
        for shape, n in solution.parts.items():
            wanted.setdefault(shape, []).append((solution, n))
    if not wanted:
        return []
    longest = max(s.longest for s in solutions)
    out = []
    for where, code in python_sources(files):
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue  # not Python (a notebook's shell escape): nothing to compare
        shapes, found = _Shapes(), {}
        for first, last, part in _parts(tree.body, longest):
            for solution, n in wanted.get(shapes.part(part)[0], []):
                found.setdefault(solution.region.task, []).append((first, last, n, solution))
        for task, spans in sorted(found.items()):
            for first, last, n, solution in sorted(spans, key=lambda s: (s[0], -s[1], -s[2])):
                if any((a, b) != (first, last) and a <= first and last <= b for a, b, _, _ in spans) \
                        or any((a, b) == (first, last) and m > n for a, b, m, _ in spans) \
                        or (out and out[-1][:3] == (where, first, task)):
                    continue  # inside a longer copy, or a smaller part found at the same place
                r = solution.region
                out.append(Leak(where, first, task, f"{n} of the {solution.size} syntax nodes of {task}'s body at "
                                                    f"{r.file}:{r.begin} ({r.function}), names aside"))
    return out



# ---------------------------------------------------------------- prose: a body's expressions in the lessons

# Operators that make a run of words a formula: arithmetic and comparisons. `|`, `&` (tables, prose) and the
# brackets and commas of a call are kept as tokens but do not count towards an expression's operators.
ARITHMETIC = frozenset({"+", "-", "*", "/", "//", "%", "**", "<", ">", "<=", ">=", "==", "!="})
MIN_TOKENS = 7
"""No expression of fewer tokens (operands, operators, brackets) is searched for in prose, and none with
fewer than MIN_OPERATORS of ARITHMETIC: `a + b`, `len(x) - 1` or `n // B` are the vocabulary a lesson needs.
`end // B - start // B` (task5.span's whole body) is 7 tokens and 3 operators."""
MIN_OPERATORS = 2
KEY_TOKENS = 15
"""An expression found in prose is a leak when it is at least SHARE of its body's tokens, or KEY_TOKENS
tokens (and MIN_TOKENS in both cases): a large body's key formula gives it away as a small body's whole
expression does, while the lessons' own formulas (a slot's address, `blocks_needed`'s arithmetic written in
the theory) stay below."""
_UNICODE = str.maketrans({"−": "-", "–": "-", "×": "*", "·": "*", "÷": "/", "≤": "<=", "≥": ">=", "≠": "!="})
_KEYWORDS = frozenset({"and", "or", "not", "in", "is", "if", "else", "for", "lambda"})
_TOKEN = re.compile(r"""
    (?P<operand>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?:-[A-Za-z_]\w*)*   # 16, 1e-4, 16-token (a word, not 16 - token)
      |[A-Za-z_]\w+(?:-[A-Za-z_]\w+)+                               # copy-on-write: words of two letters or more
      |[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*                              # x, self.block_size (`B-lo` is B - lo)
      |"[^"\n]*"|'[^'\n]*')
    |(?P<op>//|\*\*|<=|>=|==|!=|[-+*/%<>()\[\]{},:=|&^@])
    """, re.X)


def _tokens(text: str) -> Iterator[tuple[int, str]]:
    """(offset, token) of a text read as an expression: every name, number or string is `X`, a keyword itself,
    an operator itself (after `str.translate(_UNICODE)`); anything else (prose punctuation, `=` of a formula
    written out) ends nothing and is skipped."""
    for m in _TOKEN.finditer(text.translate(_UNICODE)):
        if m["operand"]:
            yield m.start(), m[0] if m[0] in _KEYWORDS else "X"
        else:
            yield m.start(), m[0]


class Formula(NamedTuple):
    """An expression of a reference body, as prose would write it: its tokens, names and numbers erased."""

    region: Region
    tokens: tuple[str, ...]
    body_tokens: int


def solution_formulas(root: Path | None = None, chapters: Iterable[str] | None = None) -> list[Formula]:
    """The expressions of the chapters' reference bodies worth searching for in prose: MIN_TOKENS and
    MIN_OPERATORS at least, and SHARE of their body or KEY_TOKENS."""
    root = (root or REPO_ROOT).resolve()
    out, seen = [], set()
    for r, source in _solutions(root, chapters):
        tree = ast.parse(source, str(r.file))
        inside = next(([s for s in body if r.begin < s.lineno and (s.end_lineno or s.lineno) < r.end]
                       for body in _statement_lists(tree) if any(r.begin < s.lineno < r.end for s in body)), [])
        body = [t for _, t in _tokens("\n".join(ast.unparse(s) for s in inside))]
        least = max(MIN_TOKENS, min(KEY_TOKENS, math.ceil(SHARE * len(body))))
        for statement in inside:
            for node in ast.walk(statement):
                if not isinstance(node, ast.expr) or isinstance(node, ast.JoinedStr | ast.Constant):
                    continue
                tokens = tuple(t for _, t in _tokens(ast.unparse(node)))
                operators = sum(t in ARITHMETIC for t in tokens)
                if len(tokens) >= least and operators >= MIN_OPERATORS and (r.task, tokens) not in seen:
                    seen.add((r.task, tokens))
                    out.append(Formula(r, tokens, len(body)))
    return out


def markdown_sources(files: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(file, text) of the lessons' markdown in `files`: every `.md` file, and each notebook cell, markdown or
    code (named `NOTEBOOK (cell N)`, its lines counted from the cell's first)."""
    for where, text in sorted(files.items()):
        if where.endswith(".md"):
            yield where, text
        elif where.endswith(".ipynb"):
            for i, source in notebook_cells(text, ("markdown", "code")):
                yield f"{where} (cell {i})", source


def prose_leaks(files: Mapping[str, str], formulas: list[Formula]) -> list[Leak]:
    """Every place in the markdown of `files` that writes out one of `formulas` (token for token, names and
    numbers erased, in prose, a code span or a fenced block); of the formulas of one task found at one place,
    the longest is named."""
    by_start: dict[tuple[str, ...], list[Formula]] = {}
    for f in formulas:
        by_start.setdefault(f.tokens[:MIN_TOKENS], []).append(f)
    if not by_start:
        return []
    out = []
    for where, text in markdown_sources(files):
        found = list(_tokens(text))
        tokens = [t for _, t in found]
        best: dict[tuple[int, str], Formula] = {}
        for i in range(len(tokens) - MIN_TOKENS + 1):
            for f in by_start.get(tuple(tokens[i:i + MIN_TOKENS]), []):
                if tuple(tokens[i:i + len(f.tokens)]) == f.tokens:
                    line = text.count("\n", 0, found[i][0]) + 1
                    key = (line, f.region.task)
                    if key not in best or len(f.tokens) > len(best[key].tokens):
                        best[key] = f
        for (line, task), f in sorted(best.items()):
            if out and out[-1][:3] == (where, line, task):
                continue
            r = f.region
            out.append(Leak(where, line, task, f"an expression of {len(f.tokens)} of the {f.body_tokens} tokens of "
                                               f"{task}'s body at {r.file}:{r.begin} ({r.function}), written out: "
                                               f"{' '.join(f.tokens)}"))
    return out


# ---------------------------------------------------------------- all three, on a release


def leaks_in(files: Mapping[str, str], root: Path | None = None, chapters: Iterable[str] | None = None
             ) -> list[Leak]:
    """The three searches over `files` (path relative to the release -> text) for the reference bodies that
    `chapters` (default: all) of the course at `root` hand out as stubs."""
    return (text_leaks(files, solution_bodies(root, chapters))
            + shape_leaks(files, solution_shapes(root, chapters))
            + prose_leaks(files, solution_formulas(root, chapters)))


def read_texts(folder: Path) -> dict[str, str]:
    """Every text file below `folder` (path relative to it -> text); binary files are left out."""
    out = {}
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        try:
            out[str(path.relative_to(folder))] = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
    return out


def find_leaks(release_dir: Path, root: Path | None = None, chapters: Iterable[str] | None = None) -> list[Leak]:
    """The three searches over a written release, and the search for the instructors' text (`instructor_leaks`):
    what `release` checked before writing it, checked again."""
    texts = read_texts(Path(release_dir))
    return leaks_in(texts, root, chapters) + instructor_leaks(texts, root)


def describe(found: list[Leak]) -> str:
    """One line per leak: the task, the file and line of the copy, and what was found there."""
    return "\n".join(f"  {leak.task}: {leak.file}:{leak.line}: {leak.what}" for leak in found)


# ---------------------------------------------------------------- the instructors' text: answer keys and rubrics

INSTRUCTOR_TEXTS = ("instructors/answers", "instructors/rubrics")  # markdown that no release may quote
KEY_WORDS = 12
"""A run of this many consecutive words of an answer key or a rubric (case, punctuation and markup aside) found in
a release is a leak: a sentence of a key, a rubric item, pasted into a lesson, a notebook, a docstring or a test.
Runs that the thought questions themselves hold (a key may quote its question) are not searched for. Twelve words
are a clause: below it, the course's own phrasing ("the number of tokens in the block") repeats by chance."""
_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[re.Match[str]]:
    return list(_WORD.finditer(text.lower()))


def _runs(words: list[str]) -> Iterator[tuple[int, tuple[str, ...]]]:
    for i in range(len(words) - KEY_WORDS + 1):
        yield i, tuple(words[i:i + KEY_WORDS])


def instructor_runs(root: Path | None = None) -> dict[tuple[str, ...], str]:
    """Every KEY_WORDS-word run of the course's answer keys and rubrics (INSTRUCTOR_TEXTS), less those of the
    chapters' thought questions, -> where it is (`instructors/answers/step01.md, answer 3`)."""
    root = (root or REPO_ROOT).resolve()
    asked = {run for package in select_chapters(None, root) for q in questions(package, root)
             for text in (q.text, plain(q.text)) for _, run in _runs([m[0] for m in _words(text)])}
    out: dict[tuple[str, ...], str] = {}
    for folder in INSTRUCTOR_TEXTS:
        for path in sorted((root / folder).glob("*.md")):
            parts = re.split(r"^## (\d+)\. ", path.read_text(), flags=re.M)
            for number, body in [("", parts[0]), *zip(parts[1::2], parts[2::2])]:
                where = f"{folder}/{path.name}" + (f", question {number}" if number else "")
                for _, run in _runs([m[0] for m in _words(body)]):
                    if run not in asked:
                        out.setdefault(run, where)
    return out


def _plain_texts(files: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(file, text) of every text file, a notebook as its cells (named `NOTEBOOK (cell N)`): JSON's escapes would
    cut a notebook's sentences."""
    for where, text in sorted(files.items()):
        if where.endswith(".ipynb"):
            try:
                yield from ((f"{where} (cell {i})", source) for i, source in notebook_cells(text, ("markdown", "code")))
                continue
            except (ValueError, KeyError):
                pass  # not a notebook after all: its text as it is
        yield where, text


def instructor_leaks(files: Mapping[str, str], root: Path | None = None) -> list[Leak]:
    """Every place in `files` (path in the release -> text) that quotes KEY_WORDS consecutive words of an answer key
    or a rubric of the course at `root`; one leak per file, line and source (its `task` names the key or rubric)."""
    runs = instructor_runs(root)
    if not runs:
        return []
    starts = {run[:2] for run in runs}
    out: list[Leak] = []
    for where, text in _plain_texts(files):
        found = _words(text)
        words = [m[0] for m in found]
        seen: set[str] = set()  # a pasted paragraph is one leak, named where it starts
        for i in range(len(words) - KEY_WORDS + 1):
            if (words[i], words[i + 1]) in starts and (source := runs.get(tuple(words[i:i + KEY_WORDS]))) \
                    and source not in seen:
                seen.add(source)
                out.append(Leak(where, text.count("\n", 0, found[i].start()) + 1, source,
                                f"quotes the instructors' text: \"{' '.join(words[i:i + KEY_WORDS])} ...\""))
    return out
