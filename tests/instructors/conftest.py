"""Each test's outcome, kept on its item: the audit of the answer keys (the last test of test_answer_keys.py)
reads what the file's other tests checked, so it runs only when all of them ran and passed."""
from __future__ import annotations

import pytest

_OUTCOME = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed or report.skipped:  # in setup, call or teardown
        item.stash[_OUTCOME] = report.outcome
    elif report.when == "call":
        item.stash.setdefault(_OUTCOME, "passed")
    return report


@pytest.fixture
def file_outcomes(request: pytest.FixtureRequest) -> dict[str, str]:
    """Name -> outcome ('passed', 'failed', 'skipped' or 'not run') of every other selected test of the file."""
    return {item.name: item.stash.get(_OUTCOME, "not run") for item in request.session.items
            if item.path == request.node.path and item is not request.node}
