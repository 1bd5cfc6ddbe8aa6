"""The chapter's micro-benchmarks run and give plausible magnitudes."""
from __future__ import annotations

from benchmarks.step03.bench import hash_seconds_per_token, lookup_seconds


def test_micro_benchmarks_run():
    assert 0 < hash_seconds_per_token(256) < 1e-3
    assert 0 < lookup_seconds(256) < 1e-2
