"""The chapter's bench plumbing without the real model: registration and the bookkeeping micro-benchmark."""
from __future__ import annotations

from course.bench import BENCHES
from step04_radix import bench


def test_registered_under_the_chapter_name():
    assert BENCHES["step04"] is bench.bench_step04


def test_bookkeeping_bench_reports_every_part():
    r = bench.bookkeeping_bench(prefix_len=300, new_len=10, requests=20)
    assert r["bookkeeping_tokens"] == 310
    parts = [r[f"bookkeeping_{k}_us"] for k in ("match", "lock", "insert", "unlock")]
    assert all(p > 0 for p in parts) and r["bookkeeping_us_median"] > 0
    assert r["bookkeeping_budget_us"] == 100.0 and isinstance(r["bookkeeping_within_budget"], bool)
