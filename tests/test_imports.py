"""The course's import structure: the layers of pyproject.toml's import-linter contract (`lint-imports`, which `make
test` runs) name every chapter and every module of `course`, so that nothing escapes them; nothing imports in a circle;
and importing a chapter changes nothing in the process (chapter 6's kernels need Triton's interpreter switched on
before triton is imported: the importer's job)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from course.chapters import chapters
from course.paths import REPO_ROOT

PACKAGES = ["course", "benchmarks", *chapters()]


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


def _layers() -> list[list[str]]:
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [[m.strip() for m in layer.replace("|", ":").split(":")] for layer in contract["layers"]]


def test_the_layers_name_every_package_and_every_module_of_course():
    """A module in no layer is checked by nothing: every chapter is a layer of its own, in order, below the
    benchmarks and above the shared plumbing, and each top-level module or package of `course` is in one layer."""
    layers = _layers()
    tops = [layer[0] for layer in layers if len(layer) == 1]
    assert tops == ["benchmarks", *reversed(chapters())], f"the single-package layers are {tops}"
    named = [m for layer in layers for m in layer if m.startswith("course.")]
    own = sorted(f"course.{p.stem}" for p in (REPO_ROOT / "course").iterdir()
                 if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file())
    assert sorted(named) == own, f"course's modules {own}, the layers name {sorted(named)}"
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert sorted(config["root_packages"]) == sorted(["course", "benchmarks", *chapters()])


def test_no_chapter_holds_measurement():
    """A chapter package holds what its lesson teaches; its benches, reports and measures live in benchmarks/."""
    held = [f"{c}/{name}" for c in chapters() for name in ("bench.py", "report.py", "measure", "host_bench.py",
                                                         "spec_bench.py", "policy_bench.py", "tier_bench.py")
            if (REPO_ROOT / c / name).exists()]
    assert not held, f"measurement inside a chapter: {held} (it belongs in benchmarks/stepNN/)"
    assert sorted(p.name for p in (REPO_ROOT / "benchmarks").glob("step*")) == [c.split("_")[0] for c in chapters()]


def test_the_layers_hold():
    """What `make test` runs first, here too so that a test run alone says it."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stdout[-3000:]


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
