"""The chapter's bench plumbing without the real model: registration, the bookkeeping micro-benchmark and the
comparison of scheduling policies."""
from __future__ import annotations

import argparse

from benchmarks.runner import BENCHES
from benchmarks.step04 import bench
from benchmarks.step04 import policies as policy_bench
from step01_kvcache.tiny import tiny_model


def test_registered_under_the_chapter_name():
    assert BENCHES["step04"] is bench.bench_step04


def test_bookkeeping_bench_reports_every_part():
    r = bench.bookkeeping_bench(prefix_len=300, new_len=10, requests=20)
    assert r["bookkeeping_tokens"] == 310
    parts = [r[f"bookkeeping_{k}_us"] for k in ("match", "lock", "insert", "unlock")]
    assert all(p > 0 for p in parts) and r["bookkeeping_us_median"] > 0
    assert r["bookkeeping_budget_us"] == 100.0 and isinstance(r["bookkeeping_within_budget"], bool)


def test_policy_bench_compares_every_policy_on_both_designs(monkeypatch, tokenizer):
    """`--workload multi_doc` on a tiny model (the real one's tokens): lpm beats fcfs on hits in the tight pool and
    ties it in the roomy one, the bounded run keeps its bound, and the answers never change."""
    wide = tiny_model(seed=7, vocab_size=49152, max_position_embeddings=4096, num_layers=1, hidden_size=32,
                      intermediate_size=32, head_dim=8)
    monkeypatch.setattr("step01_kvcache.pretrained.load_model", lambda path=None: wide)
    r = bench.bench_step04(argparse.Namespace(workload="multi_doc", model=None, max_new_tokens=None, repeats=1))
    assert r["workload"] == "multi_doc" and r["requests"] == 12 and r["outputs_identical"] is True
    runs = {(x["design"], x["pool"], x["policy"]): x for x in r["runs"]}
    bounded = f"lpm, <={policy_bench.BOUND} overtakes"
    assert {k[2] for k in runs if k[0] == "hash"} == {"fcfs", "lpm", bounded}
    assert ("radix", "tight", "dfs-weight") in runs
    for design in ("hash", "radix"):
        tight = {p: runs[(design, "tight", p)] for p in ("fcfs", "lpm", bounded)}
        assert tight["lpm"]["hit_rate"] > tight[bounded]["hit_rate"] > tight["fcfs"]["hit_rate"]
        assert tight["lpm"]["prefill_tokens"] < tight["fcfs"]["prefill_tokens"]
        assert tight["fcfs"]["most_overtaken"] == 0 < tight[bounded]["most_overtaken"] <= policy_bench.BOUND
        assert runs[(design, "roomy", "fcfs")]["hit_rate"] == runs[(design, "roomy", "lpm")]["hit_rate"]
        for run in tight.values():
            assert sorted(run["admission_order"]) == list(range(12)) and run["preemptions"] == 0
            assert run["prefill_tokens"] + run["cached_tokens"] == r["prompt_tokens"]
            assert run["ttft_p99_s"] >= run["ttft_mean_s"] > 0 and run["ttft_tokens_p99"] >= run["ttft_tokens_mean"]
    assert r["order_cost"]["lpm_1024_us"] > r["order_cost"]["fallback_1024_us"]


def test_p99_is_the_nearest_rank():
    assert policy_bench.p99([3.0, 1.0, 2.0]) == 3.0
    assert policy_bench.p99(list(range(1, 201))) == 198
