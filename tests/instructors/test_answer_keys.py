"""The answer keys of the thought questions (instructors/answers/stepNN.md) against the chapters' code.

Every number an answer states is computed here from the code it talks about, and must appear in the
answer. Instructors only: the student release leaves this folder and the keys out.
"""
from __future__ import annotations

import json
import math
import re

import pytest
import torch

from course.chapters import chapters
from course.paths import REPO_ROOT
from course.tiny import tiny_model
from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.kv_cache import KVCache

KEYS = REPO_ROOT / "instructors" / "answers"
pytestmark = pytest.mark.skipif(not KEYS.is_dir(), reason="the answer keys are not part of a student release")
GREEDY = dict(stop_token_ids=())


def answer(chapter: str, n: int) -> str:
    """The text of answer `n` in the chapter's key (from its '## n.' heading to the next heading)."""
    text = (KEYS / f"{chapter}.md").read_text()
    m = re.search(rf"^## {n}\. .*?(?=^## |\Z)", text, re.S | re.M)
    assert m, f"instructors/answers/{chapter}.md has no answer '## {n}.'"
    return " ".join(m.group(0).split())


def says(chapter: str, n: int, *numbers: str) -> None:
    text = answer(chapter, n)
    for number in numbers:
        assert number in text, f"answer {n} of {chapter} should say {number!r} (computed from the code)"


def questions(package: str) -> int:
    """How many thought questions the chapter's README asks."""
    readme = (REPO_ROOT / package / "README.md").read_text()
    part = readme.split("**Thought questions**", 1)[1].split("**Homework", 1)[0]
    return len(re.findall(r"^\d+\. ", part, re.M))


@pytest.mark.parametrize("package", [c for c in chapters()
                                     if "**Thought questions**" in (REPO_ROOT / c / "README.md").read_text()])
def test_every_thought_question_has_an_answer(package: str):
    chapter = package.split("_")[0]
    assert (KEYS / f"{chapter}.md").is_file(), f"no answer key instructors/answers/{chapter}.md"
    for n in range(1, questions(package) + 1):
        assert len(answer(chapter, n)) > 200
    assert not re.search(rf"^## {questions(package) + 1}\. ", (KEYS / f"{chapter}.md").read_text(), re.M), \
        "the key answers more questions than the README asks (renumbered?)"


def test_keys_cite_sources_by_name():
    for key in KEYS.glob("*.md"):
        text = key.read_text()
        assert not re.search(r"\bseed 0\d\d\b|\bBug \d\b|\bissue \d+\b|DESIGN\.md", text, re.I), key.name


# ---------------------------------------------------------------- chapter 1


def _smollm2():
    """SmolLM2's config and parameter count, read from the GGUF header (no weights converted)."""
    gguf = pytest.importorskip("gguf")
    from course.pretrained import config_from_gguf, gguf_path

    reader = gguf.GGUFReader(gguf_path())
    return config_from_gguf(reader), sum(int(t.n_elements) for t in reader.tensors)


def test_step01_q1_cache_memory():
    cfg, params = _smollm2()
    per_token = cfg.kv_bytes_per_token()
    fp32 = KVCache(cfg, 8192, torch.float32, "meta").nbytes()
    bf16 = KVCache(cfg, 8192, torch.bfloat16, "meta").nbytes()
    says("step01", 1, f"{per_token:,} bytes", f"{fp32 // 2**20} MiB", f"{bf16 // 2**20} MiB", f"{params:,}",
         f"{math.ceil(params * 4 / per_token):,} tokens")


def test_step01_q4_token_forwards():
    model = tiny_model(seed=0)
    counted: list[int] = []
    model.register_forward_pre_hook(lambda module, args: counted.append(len(args[0])))
    p, m = 38, 32
    prompt = list(range(1, p + 1))
    totals = {}
    for cache in (False, True):
        counted.clear()
        out = generate(model, prompt, SamplingParams(max_new_tokens=m, **GREEDY), use_cache=cache)
        assert len(out) == m
        totals[cache] = sum(counted)
    assert totals == {False: m * p + m * (m - 1) // 2, True: p + m - 1}
    measured = json.loads((REPO_ROOT / "step01_kvcache" / "results" / "single.json").read_text())
    says("step01", 4, f"**{totals[False]:,}**", f"**{totals[True]}**", f"{totals[False] / totals[True]:.1f}",
         f"**{measured['figures']['speedup_cache']}**")


def test_step01_q6_reserved_memory():
    from step02_paged.kv_cache_manager import cdiv

    says("step01", 6, f"{600 / 8192:.1%}".replace("%", " %"), f"{cdiv(600, 16)} blocks",
         f"{8192 / (cdiv(600, 16) * 16):.1f} times")


# ---------------------------------------------------------------- chapter 2


def test_step02_q1_bytes_per_block():
    from step02_paged.kv_pool import KVPool

    cfg, _ = _smollm2()
    for bs in (1, 16, 256):
        says("step02", 1, f"{KVPool(cfg, 1, bs, device='meta').bytes_per_block:,} bytes")


def test_step02_q3_chunked_prefill_beside_seven_decodes():
    from step02_paged.engine import Engine, EngineConfig

    model = tiny_model(seed=0, max_position_embeddings=4096)
    engine = Engine(model, EngineConfig(num_blocks=512, block_size=16, max_num_seqs=8, max_num_batched_tokens=512))
    for i in range(7):
        engine.add_request([1 + i, 2, 3], SamplingParams(max_new_tokens=40, **GREEDY))
    engine.step()  # the seven short prompts prefill; from now on they decode
    long = engine.add_request([i % 250 + 1 for i in range(2000)], SamplingParams(max_new_tokens=2, **GREEDY))
    chunks = []
    while not engine.seqs[long].output_ids:
        engine.step()
        batch = dict(engine.last_scheduled)
        assert sum(1 for s, n in batch.items() if s != long and n == 1) == 7, "every decode runs every step"
        chunks.append(batch[long])
    assert sum(chunks) == 2000
    says("step02", 3, f"**{len(chunks)} steps**", " + ".join(map(str, chunks)))


def test_step02_q7_seat_steps():
    from step02_paged.engine import Engine, EngineConfig

    engine = Engine(tiny_model(seed=0), EngineConfig(num_blocks=256, block_size=4, max_num_seqs=8))
    lengths = [10 * (i + 1) for i in range(8)]
    for i, n in enumerate(lengths):
        engine.add_request([5 + i, 6, 7], SamplingParams(max_new_tokens=n, **GREEDY))
    seat_steps = steps = 0
    while engine.has_unfinished():
        engine.step()
        seat_steps += len(engine.last_scheduled)  # continuous batching: only unfinished requests hold a seat
        steps += 1
    assert seat_steps == sum(lengths) and steps == max(lengths)
    says("step02", 7, f"**{seat_steps}**", f"8 × {steps} = {8 * steps:,}", f"**{8 * steps - seat_steps}**", "**0**")


# ---------------------------------------------------------------- chapter 3


def test_step03_q2_a_repeated_32_token_prompt():
    from step02_paged import Engine, EngineConfig
    from step03_prefix_hash import PrefixCachingKVCacheManager

    engine = Engine(tiny_model(seed=0), EngineConfig(num_blocks=64, block_size=16), PrefixCachingKVCacheManager)
    prompt = list(range(10, 42))
    hits = []
    for _ in range(2):
        engine.add_request(prompt, SamplingParams(max_new_tokens=1, **GREEDY))
        while engine.has_unfinished():
            hits += [out.num_cached_tokens for out in engine.step()]
    assert hits[0] == 0
    hit = hits[1]
    says("step03", 2, f"**{hit}**", f"recomputes **{len(prompt) - hit}**")


def test_step03_q4_eight_requests_with_one_new_prefix():
    from step02_paged import Engine, EngineConfig
    from step03_prefix_hash import PrefixCachingKVCacheManager

    model = tiny_model(seed=0, max_position_embeddings=2048)
    engine = Engine(model, EngineConfig(num_blocks=1024, block_size=16, max_num_seqs=8, max_num_batched_tokens=8192),
                    PrefixCachingKVCacheManager)
    prefix = [(7 * i) % 250 + 1 for i in range(1000)]
    ids = [engine.add_request(prefix + [i + 1], SamplingParams(max_new_tokens=2, **GREEDY)) for i in range(8)]
    engine.step()  # all eight admitted and prefilled in one step
    seqs = [engine.seqs[i] for i in ids]
    assert all(s.num_cached_tokens == 0 for s in seqs), "nothing was published when they were admitted"
    bm = engine.cache_manager.block_manager
    full = len(prefix) // 16
    published = {b for s in seqs for b in s.block_table[:full] if bm.entries[b] is not None}
    private = [b for s in seqs for b in s.block_table[:full] if bm.entries[b] is None]
    assert len(published) == full
    says("step03", 4, "**8 times**", "**one copy**", f"{full} cached blocks", f"7 × {full} = {len(private)}")


def _step03_long() -> dict:
    """The committed `long` run of chapter 3 (`python -m course bench step03 --workload long --save`)."""
    from course import results

    return results.load("step03", "long")["figures"]


def test_step03_q6_hashing_against_prefill():
    run = _step03_long()
    sha = 2000 * run["hash_us_per_token"] / 1000  # ms
    builtin = 2000 * run["hash_builtin_us_per_token"] / 1000
    ratio = run["ttft_cold_off_s"] * 1000 / sha
    says("step03", 6, f"{run['hash_us_per_token']} µs", f"**{sha:.2f} ms**", f"{builtin:.3f} ms",
         f"{run['ttft_cold_off_s']:.1f} s", f"**{round(ratio, -4):,.0f} times**")


# ---------------------------------------------------------------- chapter 4


def _twenty_shared_tokens() -> tuple[list[int], list[int]]:
    """Two 32-token prompts that share their first 20 tokens."""
    return list(range(1, 33)), list(range(1, 21)) + list(range(100, 112))


def _hash_hit(a: list[int], b: list[int], block_size: int = 16) -> int:
    """Tokens of `b` that chapter 3's chained block hashes find once `a` is cached."""
    from step03_prefix_hash.block_hash import hash_token_blocks

    hits = 0
    for ha, hb in zip(hash_token_blocks(a, block_size), hash_token_blocks(b[:-1], block_size)):  # last token: computed
        if ha != hb:
            break
        hits += 1
    return hits * block_size


def test_step04_q1_twenty_shared_tokens():
    from step04_radix.radix_tree import RadixTree

    a, b = _twenty_shared_tokens()
    tree = RadixTree()
    tree.insert(a, list(range(32)))
    token_hit = len(tree.match_prefix(b)[0])
    tree.insert(b, list(range(32, 64)))
    upper = tree.root.children[a[0]]
    assert len(upper.key) == token_hit and set(upper.children) == {a[token_hit], b[token_hit]}
    says("step04", 1, f"reuses **{_hash_hit(a, b)}**", f"all **{token_hit}**", f"[0, {len(upper.key)})")


def test_step04_q3_what_a_block_boundary_costs():
    a, b = _twenty_shared_tokens()
    says("step04", 3, f"**{20 - _hash_hit(a, b)}** of the 20")


# ---------------------------------------------------------------- chapter 5


def test_step05_q1_split_deep_in_the_tree():
    from step05_bridge.block_radix_tree import BlockRadixTree

    tree = BlockRadixTree(16)
    head, tail = tree.span(40, 70), tree.span(70, 90)
    assert head + tail == tree.span(40, 90)
    first = 40 // 16
    says("step05", 1, f"= {tree.span(40, 90)}` blocks", f"**{head} blocks, the path's blocks {first} and {first + 1}**",
          f"**{tail} block, the path's block {first + head}**")


def test_step05_q7_references_at_block_size_one():
    from step02_paged import Engine, EngineConfig
    from step04_radix import RadixKVCacheManager
    from step05_bridge import BridgeKVCacheManager

    model = tiny_model(seed=0, max_position_embeddings=4096)
    prompt = [(3 * i) % 250 + 1 for i in range(2000)]
    counts = {}
    for manager in (BridgeKVCacheManager, RadixKVCacheManager):
        engine = Engine(model, EngineConfig(num_blocks=4096, block_size=1, max_num_batched_tokens=4096), manager)
        engine.add_request(prompt, SamplingParams(max_new_tokens=1, **GREEDY))
        while engine.has_unfinished():
            engine.step()
        ids = [engine.add_request(prompt + [i + 1], SamplingParams(max_new_tokens=3, **GREEDY)) for i in range(8)]
        engine.step()
        seqs = [engine.seqs[i] for i in ids]
        assert all(s.num_cached_tokens == len(prompt) for s in seqs)
        shared = seqs[0].block_table[: len(prompt)]
        refs = sum(engine.cache_manager.block_manager.ref_count[b] for b in shared)
        _, shared_node = engine.cache_manager.tree.match_prefix(prompt)  # where the eight requests' common prefix ends
        counts[manager.__name__] = (refs, shared_node.lock_ref)
    bridge_refs, _ = counts["BridgeKVCacheManager"]
    _, radix_locks = counts["RadixKVCacheManager"]
    assert bridge_refs == len(prompt) * 9
    says("step05", 7, f"**{bridge_refs:,}**", f"**{radix_locks}** lock references", f"`lock_ref` {radix_locks}")


def test_step05_q8_the_textbook_split_repaired():
    from step05_bridge.block_radix_tree import BlockRadixTree

    first, second = list(range(1, 49)), list(range(1, 21)) + list(range(100, 112))  # they part at token 20
    tree = BlockRadixTree(16)
    tree.insert(first, [100, 101, 102])
    reused, _ = tree.match_prefix(second)
    tree.insert(second, reused + [200])
    upper = tree.root.children[first[0]]
    mine, theirs = upper.children[first[20]], upper.children[second[20]]
    assert (len(upper.key), len(mine.key), len(theirs.key)) == (20, 28, 12)
    assert (tree.span(0, 20), tree.span(20, 48), tree.span(20, 32)) == (len(upper.value), len(mine.value),
                                                                      len(theirs.value))
    repeat, _ = tree.match_prefix(first + [999])
    offset = len(upper.key) % tree.block_size  # where the first prompt's branch starts inside block 101
    says("step05", 8, f"**block {upper.value[0]}**", f"`span(0, 20) = {tree.span(0, 20)}`",
         f"**blocks {mine.value[0]} and {mine.value[1]}**", f"`span(20, 48) = {tree.span(20, 48)}`",
         f"**block {theirs.value[0]}**", f"`span(20, 32) = {tree.span(20, 32)}`", f"**offset {offset}**",
         f"all **{len(repeat) * 16}** tokens instead of {len(reused) * 16}", f"**{20 - len(reused) * 16}** of the 20")


def test_step05_q9_loading_or_recomputing():
    rates = json.loads((REPO_ROOT / "step06_triton" / "results" / "h200_engine.json").read_text())
    rates = rates["smollm2_135m"]["host_tier"]["rates"]
    matmul = _h200()["kernels"]["ceilings"]["matmul_tflop_s"]
    load = rates["h2d_gb_s"] * 1e9 / rates["kv_bytes_per_token"]
    assert abs(load - rates["load_tokens_s"]) / load < 0.01
    need = load * 2 * 1.35e8 / 1e12
    says("step05", 9, f"**{load:,.0f} tokens/s**", f"**{need:.0f} TFLOP/s**", f"**{need / matmul:.0%}**",
         f"{rates['prefill_tokens_s']:,} tokens/s", f"**{load / rates['prefill_tokens_s']:.0f}x**", f"{matmul} TFLOP/s")


# ---------------------------------------------------------------- chapter 6


def _h200() -> dict:
    return json.loads((REPO_ROOT / "step06_triton" / "results" / "h200.json").read_text())


def _h200_sweep() -> dict:
    return json.loads((REPO_ROOT / "step06_triton" / "results" / "h200_sweep.json").read_text())["sweep"]


def test_step06_q1_intensity_and_ridge():
    from course.tiny import SMOLLM2_135M

    c = _h200()["kernels"]["ceilings"]
    g = SMOLLM2_135M["num_heads"] // SMOLLM2_135M["num_kv_heads"]
    ridge = c["matmul_tflop_s"] / c["copy_tb_s"]
    says("step06", 1, f"**{g} FLOP/byte**", "**1 FLOP/byte**", f"**{ridge:.0f} FLOP/byte**")


def test_step06_q2_splitting_a_ragged_batch():
    from step06_triton.bench import RAGGED, ragged_lengths
    from step06_triton.decode_attention import MIN_SPLIT_LEN, PROGRAMS_PER_SM, split_plan_host

    res = _h200()["kernels"]
    row = next(r for r in res["decode"] if r["ragged"] and r["heads"] == "32/8x128" and r["block_size"] == 16)
    uniform = next(r for r in res["decode"]
                   if not r["ragged"] and (r["batch"], r["context"], r["block_size"]) == (64, 4096, 16))
    lengths = ragged_lengths(RAGGED["batch"], 1, RAGGED["max_context"], RAGGED["seed"])
    assert sum(lengths) == row["total_tokens"], "the bench's ragged batch is not the JSON's"
    split_len = max(MIN_SPLIT_LEN, -(-sum(lengths) * 8 // (PROGRAMS_PER_SM * 132)))
    plan = split_plan_host(lengths, 8, row["max_splits"], 64)
    assert sum(n for n, _ in plan) * 8 == row["programs"], "the Python rule and the JSON disagree"
    sweep = {r["per_sm"]: r["tb_s"] for r in _h200_sweep()["decode"] if r["heads"] == "32/8x128"
             and r["batch"] == "ragged" and r["block_n"] in (None, 64) and r["warps"] in (None, 4)}
    assert set(split_plan_host([4096] * 64, 8, uniform["max_splits"], 64)) == {(1, 4096)}
    says("step06", 2, f"**{sum(lengths):,} tokens**", f"**{split_len} tokens**",
         f"**{plan[lengths.index(max(lengths))][0]} splits**", f"**{row['programs']:,} programs**",
         f"**{64 * 8} programs**", f"**{row['triton_first_rule_tb_s']} TB/s**", f"**{row['triton_tb_s']} TB/s**",
         f"**{sweep[4]} / {sweep[8]} / {sweep[16]} / {sweep[32]} TB/s**", "**one split**",
         f"**{uniform['triton_tb_s']} TB/s**")


def test_step06_q6_an_empty_context():
    from step06_triton.decode_attention import split_plan_host

    assert split_plan_host([0, 100], 1, 4) == [(1, 64), (1, 128)]
    says("step06", 6, "**one split**", "**zeros**")


def test_step06_q4_contiguous_bytes_per_head_and_block():
    says("step06", 4, f"**{16 * 128 * 2:,} bytes**")


def _h200_engine() -> dict:
    return json.loads((REPO_ROOT / "step06_triton" / "results" / "h200_engine.json").read_text())


def test_step06_q7_the_two_loops_from_their_parts():
    e = _h200_engine()
    d, big = e["smollm2_135m"]["random"]["decode"], e["llama_3_2_1b"]["random"]["decode"]
    step, gpu = d["sync"]["host_ms_per_step"], d["sync"]["gpu_ms_per_step"]
    host = step - gpu
    per_kernel = d["gpu_us_per_step"] / d["kernels_per_step"]
    says("step06", 7, f"**{step} ms**", f"**{gpu} ms**", f"**{host:.2f} ms**",
         f"**{max(host, d['overlap']['gpu_ms_per_step']):.2f} ms**",
         f"**{d['overlap']['decode_wall_ms'] / d['overlap']['decode_steps']:.2f} ms**", f"{d['floor_us']} µs",
         f"{big['gpu_us_per_step']} µs", f"**{per_kernel:.1f} µs**", f"**{d['floor_us'] / per_kernel:.0f} kernels**")


def test_step06_q9_the_warm_requests_floor():
    e = _h200_engine()
    d, long = e["smollm2_135m"]["random"]["decode"], e["smollm2_135m"]["long"]
    per_kernel = d["gpu_us_per_step"] / d["kernels_per_step"]
    says("step06", 9, f"**{long['warm_forward_gpu_us']} µs**",
         f"**{d['kernels_per_step'] * per_kernel / 1e3:.1f} ms**",
         f"**{long['cache_on']['cold_ms'] / long['token_bound']:.2f} ms**")
