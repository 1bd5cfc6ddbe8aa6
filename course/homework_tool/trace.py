"""Which tasks' bodies a test runs: the reference instrumented at import time, for the homework proof.

`install(roots)` puts an import hook in front of Python's: a module loaded from a file under `roots` that has
`# BEGIN SOLUTION taskN.x` markers is compiled with a call to `hit("taskN.x")` on each BEGIN line (the line
stays where it was, so tracebacks and the grader's body lines do not move). `take()` returns the tasks whose
bodies ran since the last `take()` and forgets them. Triton kernels run the same Python under the interpreter
(no GPU), so their bodies count too.

The proof's reference run (tests/test_homework_proof.py) turns it on for every tagged test: what a task's tests
end up calling is then known, not guessed, and each chapter's Exercises table must say it (its *needs* column).
"""
from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import linecache
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from .markers import find_regions

_HIT: set[str] = set()
_CALL = '__import__("course.homework_tool.trace", fromlist=["hit"]).hit({task!r})'


def hit(task: str) -> None:
    """A marked body of `task` started running."""
    _HIT.add(task)


def take() -> set[str]:
    """The tasks whose bodies ran since the last call."""
    found = set(_HIT)
    _HIT.clear()
    return found


def _compiled_kernels(source: str) -> set[str]:
    """Functions Triton compiles for a GPU (decorated `jit`), unless its interpreter runs them as Python."""
    return set() if interpreted() else kernels(source)


def kernels(source: str) -> set[str]:
    """The functions of `source` decorated as Triton kernels (`@triton.jit`)."""
    return {node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and any("jit" in ast.unparse(d) for d in node.decorator_list)}


def interpreted() -> bool:
    """Whether a Triton kernel's body runs as Python here, so that its `hit` is recorded (no GPU)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def instrumented(source: str, filename: str = "<source>") -> str:
    """`source` with each BEGIN SOLUTION line calling `hit` for its task (same lines, same line numbers); a body
    inside a Triton kernel compiled for a GPU is left as it is (its compiler reads Python it can translate)."""
    lines = source.splitlines(keepends=True)
    kernels = _compiled_kernels(source)
    for r in find_regions(source, filename):
        if r.function.split(".")[-1] in kernels:
            continue
        line = lines[r.begin - 1]
        indent = line[: len(line) - len(line.lstrip())]
        lines[r.begin - 1] = f"{indent}{_CALL.format(task=r.task)}  {line.lstrip()}"
    return "".join(lines)


class _Loader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname: str):
        source = instrumented(self.get_data(self.path).decode(), self.path)
        # Triton's interpreter reads a kernel's source again (`inspect.getsourcelines`): give it this one. An
        # entry without a modification time is never reloaded from the file by `linecache.checkcache`.
        linecache.cache[self.path] = (len(source), None, source.splitlines(keepends=True), self.path)
        return compile(source, self.path, "exec", dont_inherit=True)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds what Python's path finder finds; a marked module under `roots` gets the instrumenting loader."""

    def __init__(self, roots: Iterable[Path]) -> None:
        self.roots = [Path(r).resolve() for r in roots]
        self.venv = Path(sys.prefix).resolve()

    def find_spec(self, name, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader) or not spec.origin:
            return None
        origin = Path(spec.origin).resolve()
        if origin.is_relative_to(self.venv) or not any(origin.is_relative_to(r) for r in self.roots):
            return None
        try:
            marked = "BEGIN SOLUTION" in origin.read_text()
        except (OSError, UnicodeDecodeError):
            return None
        if not marked:
            return None
        spec.loader = _Loader(name, spec.origin)
        return spec


def install(roots: Iterable[Path]) -> _Finder:
    """Instrument the marked modules under `roots` that are imported from now on; `uninstall` undoes it."""
    finder = _Finder(roots)
    sys.meta_path.insert(0, finder)
    take()
    return finder


def uninstall(finder: _Finder) -> None:
    """Stop instrumenting (modules already imported keep their calls) and give the files' text back to linecache."""
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    for name, entry in list(linecache.cache.items()):
        if entry[1] is None and any(Path(name).is_relative_to(r) for r in finder.roots if Path(name).is_absolute()):
            del linecache.cache[name]
