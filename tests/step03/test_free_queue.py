"""The LRU free queue: O(1) popleft / append / remove with the order of a plain list."""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from step03_prefix_hash.free_queue import FreeBlockQueue


@pytest.mark.task("task3.free_queue")
def test_starts_with_every_block_in_id_order():
    q = FreeBlockQueue(5)
    assert list(q) == [0, 1, 2, 3, 4] and len(q) == 5
    q.check_invariants()
    assert list(FreeBlockQueue(4, blocks=[2, 0])) == [2, 0]


@pytest.mark.task("task3.free_queue")
def test_popleft_append_remove_keep_lru_order():
    q = FreeBlockQueue(5)
    assert q.popleft() == 0 and q.popleft() == 1
    q.append(0)  # freed last: evicted last
    assert list(q) == [2, 3, 4, 0]
    q.remove(3)  # a cache hit in the middle
    q.remove(2)  # ... at the front
    q.remove(0)  # ... at the back
    assert list(q) == [4] and len(q) == 1 and 3 not in q and 4 in q
    q.append(3)
    q.append(2)
    assert [q.popleft() for _ in range(3)] == [4, 3, 2]
    assert len(q) == 0 and list(q) == []
    q.check_invariants()


@pytest.mark.task("task3.free_queue")
def test_misuse_raises_and_changes_nothing():
    q = FreeBlockQueue(3)
    q.remove(1)
    before = list(q)
    with pytest.raises(ValueError, match="already"):
        q.append(0)
    with pytest.raises(ValueError, match="not in the free queue"):
        q.remove(1)
    with pytest.raises(ValueError):
        q.append(7)
    assert list(q) == before
    q.popleft()
    q.popleft()
    with pytest.raises(IndexError):
        q.popleft()
    q.check_invariants()
    with pytest.raises(ValueError):
        FreeBlockQueue(0)


class FreeQueueMachine(RuleBasedStateMachine):
    """Random popleft / append / remove against a Python list doing the same in O(n)."""

    N = 8

    def __init__(self):
        super().__init__()
        self.q = FreeBlockQueue(self.N)
        self.model = list(range(self.N))

    @precondition(lambda self: self.model)
    @rule()
    def popleft(self):
        assert self.q.popleft() == self.model.pop(0)

    @rule(b=st.integers(0, N - 1))
    def append(self, b):
        if b in self.model:
            with pytest.raises(ValueError):
                self.q.append(b)
        else:
            self.q.append(b)
            self.model.append(b)

    @rule(b=st.integers(0, N - 1))
    def remove(self, b):
        if b in self.model:
            self.q.remove(b)
            self.model.remove(b)
        else:
            with pytest.raises(ValueError):
                self.q.remove(b)

    @invariant()
    def same_as_the_list(self):
        self.q.check_invariants()
        assert list(self.q) == self.model and len(self.q) == len(self.model)
        assert all((b in self.q) == (b in self.model) for b in range(self.N))


TestFreeQueueMachine = pytest.mark.task("task3.free_queue")(FreeQueueMachine.TestCase)
TestFreeQueueMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
