"""A fake course in tmp_path, shared by the tests of the homework tool and of the student release."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

MATHY = '''\
"""A fake chapter module: two tasks."""
from __future__ import annotations

import functools


def add(a: int, b: int = 2, *, scale: float = 1.0) -> float:
    """Sum, scaled."""
    # BEGIN SOLUTION task91.add
    total = a + b
    return total * scale
    # END SOLUTION


class Counter:
    """Counts things."""

    @functools.lru_cache(maxsize=None)  # noqa: B019
    def triangle(self, n: int) -> int:
        """0 + 1 + ... + n - 1."""
        total = 0
        # BEGIN SOLUTION task91.triangle
        for i in range(n):
            total += i
        # END SOLUTION
        return total
'''

TESTS = '''\
import pytest

from step91_fake.mathy import Counter, add


@pytest.mark.task("task91.add")
def test_add():
    assert add(1) == 3


@pytest.mark.task("task91.add")
@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_add_scaled(scale):
    assert add(1, 1, scale=scale) == 2 * scale


@pytest.mark.task("task91.triangle")
def test_triangle():
    assert Counter().triangle(4) == 6


def test_untagged():
    assert add(0, 0) == 0
'''


@pytest.fixture
def course(tmp_path: Path) -> Path:
    """A course root with chapter step91_fake (2 tasks, 4 tagged tests + 1 untagged) and step92_uses
    (1 task, built on step91_fake by import)."""
    root = tmp_path / "course"
    (root / "step91_fake").mkdir(parents=True)
    (root / "step91_fake" / "__init__.py").write_text('"""Fake chapter 91."""\n')
    (root / "step91_fake" / "mathy.py").write_text(MATHY)
    (root / "tests" / "step91").mkdir(parents=True)
    (root / "tests" / "step91" / "test_fake.py").write_text(TESTS)
    (root / "step92_uses").mkdir()
    (root / "step92_uses" / "__init__.py").write_text(textwrap.dedent('''\
        from step91_fake.mathy import add


        def double_add(a: int) -> float:
            """Twice add(a)."""
            # BEGIN SOLUTION task92.double
            return 2 * add(a)
            # END SOLUTION
        '''))
    (root / "tests" / "step92").mkdir(parents=True)
    (root / "tests" / "step92" / "test_uses.py").write_text(textwrap.dedent('''\
        import pytest
        from step92_uses import double_add


        @pytest.mark.task("task92.double")
        def test_double():
            assert double_add(1) == 6
        '''))
    return root


@pytest.fixture(scope="session")
def step02_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A student release of this course with only chapter 2 handed out (as an autograder is built), made once
    per session; tests that change it work on a copy."""
    from course.chapters import chapters
    from course.homework_tool import stubbed_tasks
    from course.homework_tool.release import release

    if any(stubbed_tasks(c) for c in chapters()):
        pytest.skip("a student release: there is no reference to build another release from")
    return release(tmp_path_factory.mktemp("step02-release") / "course", ["step02"])
