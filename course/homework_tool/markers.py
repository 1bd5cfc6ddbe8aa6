"""Markers in reference code: what a student writes, and the stub that replaces it.

Reference code marks each body a student writes (nbgrader's convention)::

    # BEGIN SOLUTION task2.schedule points=3
    ...reference body...
    # END SOLUTION

A stub replaces the body by `raise NotImplementedError(...)` and keeps everything else: the markers (so the
student sees where to write), the signature and the docstring.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

_BEGIN = re.compile(r"^(?P<indent>[ \t]*)#\s*BEGIN SOLUTION\b(?P<rest>.*)$")
_END = re.compile(r"^(?P<indent>[ \t]*)#\s*END SOLUTION\b(?P<rest>.*)$")
_TASK_ID = re.compile(r"[\w.\-]+")
_POINTS = re.compile(r"points=([1-9][0-9]*)")
_STUB = re.compile(r'\s*raise NotImplementedError\("(?P<task>[\w.\-]+): [^"\n]*"\)\s*')


class MarkerError(ValueError):
    """Malformed BEGIN/END SOLUTION markers in reference code (the message names file and line)."""


class Region(NamedTuple):
    """One marked body: lines `begin` and `end` are the BEGIN and END comments (1-based); `points` is what
    the task is worth (`points=N` on the BEGIN line, default 1)."""

    file: Path
    begin: int
    end: int
    task: str
    function: str
    points: int = 1


def _parse_begin(rest: str, filename: str, n: int) -> tuple[str, int]:
    """'task2.schedule points=3' -> ('task2.schedule', 3); the points default to 1."""
    words = rest.split()
    if not words or not _TASK_ID.fullmatch(words[0]) or "=" in words[0]:
        raise MarkerError(f"{filename}:{n}: BEGIN SOLUTION needs exactly one task id, "
                          f"e.g. '# BEGIN SOLUTION task1.rope' (got {rest.strip()!r})")
    points = 1
    for i, word in enumerate(words[1:]):
        m = _POINTS.fullmatch(word)
        if not m or i:
            raise MarkerError(f"{filename}:{n}: BEGIN SOLUTION {words[0]} takes one option, points=N "
                              f"(a positive integer), e.g. '# BEGIN SOLUTION {words[0]} points=3' (got {word!r})")
        points = int(m[1])
    return words[0], points


def _scan(source: str, filename: str) -> list[tuple[str, int, int, int]]:
    """(task, begin, end, points) of every marked region; raises MarkerError on any inconsistency."""
    found: list[tuple[str, int, int, int]] = []
    opened: tuple[str, int, str, int] | None = None
    for n, line in enumerate(source.splitlines(), 1):
        if m := _BEGIN.match(line):
            if opened:
                raise MarkerError(f"{filename}:{n}: BEGIN SOLUTION inside the region opened at line {opened[1]} "
                                  "(regions cannot nest; close it with # END SOLUTION first)")
            task, points = _parse_begin(m["rest"], filename, n)
            opened = (task, n, m["indent"], points)
        elif m := _END.match(line):
            if not opened:
                raise MarkerError(f"{filename}:{n}: END SOLUTION without a BEGIN SOLUTION before it")
            task, begin, indent, points = opened
            if m["rest"].strip() not in ("", task):
                raise MarkerError(f"{filename}:{n}: END SOLUTION {m['rest'].strip()} closes the region of "
                                  f"{task} opened at line {begin}")
            if m["indent"] != indent:
                raise MarkerError(f"{filename}:{n}: END SOLUTION is indented differently from its BEGIN SOLUTION "
                                  f"at line {begin}")
            found.append((task, begin, n, points))
            opened = None
    if opened:
        raise MarkerError(f"{filename}:{opened[1]}: BEGIN SOLUTION {opened[0]} is never closed by # END SOLUTION")
    return found


def _functions(tree: ast.AST) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function def with a dotted name (Class.method, outer.inner), in source order."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if not isinstance(child, ast.ClassDef):
                    out.append((prefix + child.name, child))
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def find_regions(source: str, filename: str = "<source>") -> list[Region]:
    """The marked regions of one file; each must sit inside a function body (a stub is a `raise`)."""
    marked = _scan(source, filename)
    if not marked:
        return []
    funcs = _functions(ast.parse(source, filename))
    regions = []
    for task, begin, end, points in marked:
        around = [(node.lineno, name) for name, node in funcs if node.lineno < begin <= (node.end_lineno or 0)]
        if not around:
            raise MarkerError(f"{filename}:{begin}: BEGIN SOLUTION {task} is not inside a function body")
        regions.append(Region(Path(filename), begin, end, task, max(around)[1], points))
    check_points(regions)
    return regions


def check_points(regions: Iterable[Region]) -> None:
    """Every marker of a task must give it the same points (an absent points= means 1)."""
    first: dict[str, Region] = {}
    for r in regions:
        seen = first.setdefault(r.task, r)
        if seen.points != r.points:
            raise MarkerError(f"{r.file}:{r.begin}: {r.task} is worth points={r.points} here but points={seen.points} "
                              f"at {seen.file}:{seen.begin}; every BEGIN SOLUTION of a task must give the same points")


def make_stub(source: str, only: set[str] | None = None, chapter: str | None = None,
              filename: str = "<source>") -> str:
    """`source` with each marked body (of the tasks in `only`, or all) replaced by a NotImplementedError.

    The BEGIN/END comments stay, so the stub can be found again and the student sees where to write.
    """
    lines = source.splitlines(keepends=True)
    where = f"see {chapter}/README.md#exercises" if chapter else "not implemented yet"
    for r in reversed(find_regions(source, filename)):
        if only is None or r.task in only:
            begin_line = lines[r.begin - 1]
            indent = begin_line[: len(begin_line) - len(begin_line.lstrip())]
            lines[r.begin:r.end - 1] = [f'{indent}raise NotImplementedError("{r.task}: {where}")\n']
    stub = "".join(lines)
    try:
        ast.parse(stub, filename)
    except SyntaxError as exc:
        raise MarkerError(f"{filename}:{exc.lineno}: the stub is not valid Python ({exc.msg}); is the "
                          "BEGIN SOLUTION comment indented like the code it replaces?") from None
    return stub


def signatures(source: str) -> list[str]:
    """What a stub must keep of every function: decorators, name, arguments, defaults, return, docstring."""
    out = []
    for name, node in _functions(ast.parse(source)):
        decorators = "".join(f"@{ast.unparse(d)} " for d in node.decorator_list)
        kind = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
        returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
        out.append(f"{decorators}{kind} {name}({ast.unparse(node.args)}){returns}: {ast.get_docstring(node)!r}")
    return out


def is_stub(source: str, region: Region) -> bool:
    """Whether the marked body of `region` in `source` is a stub (a lone `raise NotImplementedError`)."""
    body = "".join(source.splitlines(keepends=True)[region.begin:region.end - 1])
    return bool(m := _STUB.fullmatch(body)) and m["task"] == region.task
