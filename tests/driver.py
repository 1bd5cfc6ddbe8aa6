"""Drive an engine to completion, checking every invariant after every step (shared by the chapters' tests)."""
from __future__ import annotations


def drive_checked(engine, prompts, params) -> list:
    """Add all prompts, step until drained with `check_invariants()` after each step; outputs in prompt order."""
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            done[out.seq_id] = out
        engine.check_invariants()
    return [done[i] for i in ids]
