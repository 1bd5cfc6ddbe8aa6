"""The numbers each test found moved: a check of test_prose_numbers.py names every number of its own that moved,
not only the first."""
from __future__ import annotations

import pytest

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
