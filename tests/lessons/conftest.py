"""Each test's outcome, kept on its item, and the numbers each test found moved: the audit of the lessons' numbers
(the last test of test_prose_numbers.py) reads what the file's other tests checked, so it runs only when all of them
ran and passed; a check names every number of its own that moved, not only the first."""
from __future__ import annotations

import pytest

_OUTCOME = pytest.StashKey[str]()
MOVED: list[str] = []  # what `says` did not find in the current test, one line each


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    MOVED.clear()
    result = yield
    if MOVED:
        lines, MOVED[:] = list(MOVED), []
        raise AssertionError("the lesson no longer says what the results and the code say (rerun? reworded?):\n"
                             + "\n".join(lines))
    return result


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
