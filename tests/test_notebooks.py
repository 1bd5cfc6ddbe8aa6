"""The notebooks are committed executed, so that a reader sees their pictures without running them (`make
notebooks` re-executes them in place). `make test` also executes each one afresh through nbmake. A student
release clears their outputs (the reference solutions computed them)."""
from __future__ import annotations

import json

import pytest

from course.homework_tool.release import is_release
from course.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))


def test_every_chapter_has_a_notebook():
    chapters = sorted(p.name[4:6] for p in REPO_ROOT.glob("step0*_*") if (p / "__init__.py").is_file())
    assert sorted(nb.name[:2] for nb in NOTEBOOKS) == chapters


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_keeps_its_outputs(path):
    if is_release():
        pytest.skip("a student release: outputs cleared, the student runs the notebook after the homework")
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in cells), f"{path.name} was committed unexecuted: run `make notebooks`"
    outputs = [o for c in cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"], f"{path.name} was committed with an error"
    pictures = [o for o in outputs if {"image/svg+xml", "image/png"} & set(o.get("data", {}))]
    assert pictures, f"{path.name} shows no picture: run `make notebooks` (graphviz's `dot` draws the trees)"
