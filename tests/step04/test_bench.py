"""The chapter's bench plumbing without the real model: registration, the bookkeeping micro-benchmark, and the
side-by-side with chapter 3 degrading to a message when chapter 3 cannot be imported."""
from __future__ import annotations

import builtins

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


def test_side_by_side_skips_chapter3_with_a_message(monkeypatch):
    real_import = builtins.__import__

    def no_step03(name, *args, **kwargs):
        if name.startswith("step03_prefix_hash"):
            raise ImportError("not written yet")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_step03)
    fn, why = bench.step03_bench()
    assert fn is None and "not importable" in why and "radix only" in why
