"""The GPU bench's `long` part (benchmarks/step06/engine.py `long_ttft`) dry-run on a CPU, so that its request
pattern is right before it spends device time: a tiny model on the torch path stands in for the GPU engine, and the
device's synchronisation and copy probe are stubbed. Every cold request must compute the whole prompt, every warm one
find the 2,080 cached tokens (the bench asserts both), on the cache-on engine; the cache-off engine finds nothing."""
from __future__ import annotations

import pytest
import torch

from benchmarks.step06 import engine as bench
from step01_kvcache.tiny import tiny_model
from step06_triton.engine import make_engine


@pytest.fixture
def on_cpu(monkeypatch):
    def engine_for(model, prompts, new_tokens, prefix_cache="bridge", compile=False, **_):
        blocks = sum(-(-(len(p) + new_tokens) // bench.BLOCK) for p in prompts) + 64
        return make_engine(model, prefix_cache, "torch", num_blocks=blocks, block_size=bench.BLOCK,
                           max_num_seqs=len(prompts), max_num_batched_tokens=8192, compile=compile)

    monkeypatch.setattr(bench, "engine_for", engine_for)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda: 1e12)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)


@pytest.mark.slow
def test_long_measures_eight_cold_and_eight_warm_requests(on_cpu):
    result = bench.long_ttft(tiny_model(max_position_embeddings=4096))
    on, off = result["cache_on"], result["cache_off"]
    assert on["requests"] == off["requests"] == 8
    assert len(on["cold_runs_ms"]) == len(on["warm_ms"]) == 8 and len(off["warm_ms"]) == 8
    assert on["cold_median_ms"] > 0 and on["warm_median_ms"] > 0
    assert result["warm_over_cold"] == round(on["cold_median_ms"] / on["warm_median_ms"], 2)
    assert result["token_bound"] == 55.7, "2,118 tokens a request, 38 computed when warm"
    assert bench.cold_ms(on) == on["cold_median_ms"]
    assert result["host_profile"]["requests"] == 7
    compiled = result["cache_on_compiled"]
    assert "error" not in compiled, compiled
    assert len(compiled["warm_ms"]) == 8 and compiled["compile_s"] > 0
    assert set(compiled["warm_kernels"]) == {"kernels", "gpu_us", "top"}
