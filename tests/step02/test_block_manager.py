"""BlockManager: O(1) allocate/free, symmetric retain/release, clear errors that change nothing."""
from __future__ import annotations

import copy

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from step02_paged.block_manager import BlockManager, OutOfBlocksError


def snapshot(bm: BlockManager):
    return list(bm.ref_count), list(bm.free_blocks)


@pytest.mark.task("task2.allocate_free")
def test_allocate_then_release_returns_blocks():
    bm = BlockManager(4)
    a = bm.allocate(3)
    assert len(set(a)) == 3 and bm.num_free == 1
    assert all(bm.ref_count[b] == 1 for b in a)
    assert bm.release(a) == a
    assert bm.num_free == 4
    bm.check_invariants()


@pytest.mark.task("task2.allocate_free")
def test_shared_block_is_freed_by_its_last_holder():
    bm = BlockManager(2)
    [b] = bm.allocate(1)
    bm.retain([b])
    assert bm.ref_count[b] == 2
    assert bm.release([b]) == [] and bm.num_free == 1
    assert bm.release([b]) == [b] and bm.num_free == 2


@pytest.mark.task("task2.allocate_free")
def test_over_allocation_raises_and_changes_nothing():
    bm = BlockManager(3)
    bm.allocate(2)
    before = snapshot(bm)
    with pytest.raises(OutOfBlocksError):
        bm.allocate(2)
    assert snapshot(bm) == before


@pytest.mark.task("task2.allocate_free")
def test_double_free_raises_and_changes_nothing():
    bm = BlockManager(3)
    a = bm.allocate(2)
    bm.release([a[0]])
    before = snapshot(bm)
    with pytest.raises(ValueError, match="below zero"):
        bm.release([a[1], a[0]])  # a[1] is fine, a[0] is already free: nothing may change
    assert snapshot(bm) == before
    with pytest.raises(ValueError, match="below zero"):
        bm.release([a[1], a[1]])
    assert snapshot(bm) == before


def test_bad_ids_and_sizes():
    bm = BlockManager(2)
    with pytest.raises(ValueError):
        bm.retain([5])
    with pytest.raises(ValueError, match="free"):
        bm.retain([0])
    with pytest.raises(ValueError):
        BlockManager(0)
    bm.check_invariants()


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / retain / release against a model of who holds what."""

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(8)
        self.held: list[int] = []  # one entry per outstanding hold

    @rule(n=st.integers(0, 4))
    def allocate(self, n):
        if n > self.bm.num_free:
            before = snapshot(self.bm)
            with pytest.raises(OutOfBlocksError):
                self.bm.allocate(n)
            assert snapshot(self.bm) == before
        else:
            self.held += self.bm.allocate(n)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def retain(self, data):
        b = data.draw(st.sampled_from(self.held))
        self.bm.retain([b])
        self.held.append(b)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data):
        b = data.draw(st.sampled_from(self.held))
        self.held.remove(b)
        freed = self.bm.release([b])
        assert freed == ([] if b in self.held else [b])

    @rule(b=st.integers(0, 7))
    def release_unheld_is_rejected(self, b):
        if b not in self.held:
            before = copy.deepcopy(snapshot(self.bm))
            with pytest.raises(ValueError):
                self.bm.release([b])
            assert snapshot(self.bm) == before

    @invariant()
    def consistent(self):
        self.bm.check_invariants()
        for b in range(8):
            assert self.bm.ref_count[b] == self.held.count(b)


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
