"""Hypothesis state machine over chapter 3's engine (tests/machines.py): random add (shared-prefix prompts,
salts, exact repeats) / step / abort / reset, with every invariant checked after every operation, every
finished answer equal to step01's, and a clean drain."""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.machines import MODEL, STEMS, EngineMachine

from .helpers import cached_engine, snapshot


class PrefixEngineMachine(EngineMachine):
    def __init__(self):
        super().__init__()
        self.history: list[tuple[int, ...]] = []

    def make_engine(self):
        return cached_engine(MODEL, num_blocks=12, block_size=4, max_num_seqs=3, max_num_batched_tokens=10,
                             **self.speculation)

    def submit(self, prompt, new, salt=None):
        super().submit(prompt, new, cache_salt=salt)
        self.history.append(prompt)

    @rule(stem=st.integers(0, len(STEMS) - 1), cut=st.integers(1, 24), tail=st.lists(st.integers(0, 255), max_size=6),
          new=st.integers(1, 8), salt=st.sampled_from([None, None, "a"]))
    def add(self, stem, cut, tail, new, salt):
        self.submit(tuple(STEMS[stem][:cut] + tail), new, salt)

    @precondition(lambda self: self.history)
    @rule(data=st.data(), new=st.integers(1, 4))
    def add_again(self, data, new):
        """An exact repeat of an earlier prompt: once its blocks are cached, a full hit."""
        self.submit(data.draw(st.sampled_from(self.history)), new)

    def check_output(self, out, prompt):
        assert out.num_cached_tokens <= len(prompt) - 1 and out.num_cached_tokens % 4 == 0

    @rule()
    def reset(self):
        if self.engine.cache_manager.holders:
            before = snapshot(self.engine.cache_manager)
            with pytest.raises(RuntimeError):
                self.engine.cache_manager.reset_cache()
            assert snapshot(self.engine.cache_manager) == before
        else:
            self.engine.cache_manager.reset_cache()
            assert self.engine.cache_manager.block_manager.num_cached == 0


TestPrefixEngineMachine = PrefixEngineMachine.TestCase
TestPrefixEngineMachine.settings = settings(max_examples=60, stateful_step_count=35, deadline=None)
