"""`/metrics` in Prometheus' text format, under vLLM's names: what runs, what waits, the blocks requests hold and the
prefix cache's hits, each equal to what the engine and its cache manager count."""
from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import MODEL
from .test_server import client
from .test_streaming import drained

pytestmark = pytest.mark.timeout(120)


def scrape(url: str) -> dict[str, float]:
    """Every sample, by name and labels other than the model's: {'vllm:num_requests_running': 0.0, ...}."""
    response = httpx.get(f"{url}/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            samples[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return samples


def test_metrics_follow_a_running_request_and_the_cache(served):
    url, engine = served
    before = scrape(url)
    body = {"model": MODEL, "prompt": list(range(2000, 2040)), "max_tokens": 300, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        next(lines)  # the request runs: it holds the blocks of its prompt and answer so far
        during = scrape(url)
    drained(engine)
    assert during["vllm:num_requests_running"] == 1 and during["vllm:num_requests_waiting"] == 0
    assert during["kvcourse:kv_blocks_used"] >= 3  # 40 prompt tokens and the first answer token: three 16-token blocks
    assert during["vllm:kv_cache_usage_perc"] == during["kvcourse:kv_blocks_used"] / engine.config.num_blocks

    for _ in range(2):  # the same prompt twice: the second reuses two full blocks
        client(url).completions.create(model=MODEL, prompt=list(range(3000, 3040)), max_tokens=2, temperature=0)
    after = scrape(url)
    stats = engine.cache_manager.stats
    assert after["vllm:prefix_cache_queries_total"] == stats.queried_tokens
    assert after["vllm:prefix_cache_hits_total"] == stats.hit_tokens
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == 32
    assert after["kvcourse:prefix_cache_hit_rate"] == pytest.approx(stats.hit_rate)
    assert after["vllm:num_requests_running"] == after["kvcourse:kv_blocks_used"] == 0
    ended = {k: after[k] - before.get(k, 0) for k in after if k.startswith("vllm:request_success_total")}
    assert ended == {"vllm:request_success_total{finished_reason=abort}": 1,
                     "vllm:request_success_total{finished_reason=length}": 2}
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] >= 4
    assert after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"] == 3
