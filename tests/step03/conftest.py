"""Chapter 3's tests: `alone` runs a test on the bodies of its own tasks and the stand-ins of the chapter's others."""
from __future__ import annotations

import pytest

from .stand_in import use_stand_ins


@pytest.fixture
def alone(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bodies of the tasks this test is tagged with as written, every other body of chapter 3 as its stand-in
    (stand_in.py), for this test only: a task's tests then need none of the chapter's other tasks."""
    use_stand_ins(monkeypatch, keep=[m.args[0] for m in request.node.iter_markers("task") if m.args])
