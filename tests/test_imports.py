"""The course's import structure: chapters import earlier chapters and `course/`, `course/` imports no chapter but
the model it loads (chapter 1's), nothing imports in a circle, and importing a chapter changes nothing in the
process (chapter 6's kernels need Triton's interpreter switched on before triton is imported: the importer's job)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from course.chapters import chapters
from course.paths import REPO_ROOT

PACKAGES = ["course", *chapters()]


def _module(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The course's modules that `path` imports (at the top or inside a function)."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from .x` is package.x, `from ..x` the parent package's x
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return found & modules


def _graph() -> dict[str, set[str]]:
    files = [p for package in PACKAGES for p in (REPO_ROOT / package).rglob("*.py")]
    modules = {_module(p) for p in files}
    return {_module(p): _imports(p, modules) - {_module(p)} for p in files}


def test_course_imports_no_chapter_but_the_model():
    graph = _graph()
    named = {(m, i) for m, imports in graph.items() if m.split(".")[0] == "course" for i in imports
             if i.split(".")[0] not in ("course", "step01_kvcache")}
    assert not named, f"course/ imports a chapter by name (register it instead): {sorted(named)}"


def test_no_import_circle():
    graph = _graph()

    def reachable(start: str) -> set[str]:
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo += graph[module]
        return seen

    circles = sorted(m for m in graph if m in reachable(m))
    assert not circles, f"modules that import themselves through others: {circles}"


def test_importing_a_chapter_changes_nothing():
    code = ("import importlib, os, sys; before = dict(os.environ)\n"
            f"for chapter in {chapters()!r}: importlib.import_module(chapter)\n"
            "changed = sorted(k for k in {*os.environ, *before} if os.environ.get(k) != before.get(k))\n"
            "print(changed, 'triton' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # this process switched it on
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, env=env,
                          check=True)
    assert done.stdout.strip() == "[] False", f"importing the chapters set {done.stdout.strip()} (variables, triton)"
