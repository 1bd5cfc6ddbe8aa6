"""The answer keys of the thought questions (instructors/answers/stepNN.md) against the chapters' code.

Every number an answer key states is checked here: recomputed from the code it talks about, read from the
chapter's committed results (`stepNN_*/results/*.json`, which `make bench` rewrites: never typed here), or
given by the question itself (its README text, or a constant of the model it names). `says` checks that an
answer states a number and records what it checked; the last test of the file then finds every number in the
keys and fails on one that no `says` checked, that the question does not give, and that `ALLOWED` does not
list with its reason. Instructors only: the student release leaves this folder and the keys out.
"""
from __future__ import annotations

import functools
import inspect
import json
import math
import re
import sys
from collections import defaultdict

import pytest
import torch

from benchmarks.step06 import engine_report
from benchmarks.step06 import report as step06_report
from course import results
from course.chapters import chapters
from course.homework_tool import written
from course.paths import REPO_ROOT
from step01_kvcache.config import ModelConfig
from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.kv_cache import KVCache
from step01_kvcache.tiny import SMOLLM2_135M, tiny_model
from step02_paged.geometry import PoolGeometry, cdiv

KEYS = REPO_ROOT / "instructors" / "answers"
pytestmark = pytest.mark.skipif(not KEYS.is_dir(), reason="the answer keys are not part of a student release")
GREEDY = dict(stop_token_ids=())
NUMBER = re.compile(r"(?<!\w)[0-9]+(?:[,.][0-9]+)*")  # 8,192 and 0.0906 are one number each; h200, fp32 none
CROSS_REFERENCE = re.compile(r"\b(?:chapter|question)s? \d+", re.I)  # "chapter 5", "question 3": not figures
CHECKED: dict[tuple[str, int], set[str]] = defaultdict(set)  # (chapter, question) -> numbers `says` checked


def numbers(text: str) -> set[str]:
    """The numbers in a text, written without thousands separators (so `8192` in code is README's 8,192)."""
    return {n.replace(",", "") for n in NUMBER.findall(text)}


def sections(chapter: str) -> dict[int, str]:
    """The key's answers by question number, 0 for the text above the first answer; whitespace collapsed."""
    text = (KEYS / f"{chapter}.md").read_text()
    parts = re.split(r"^## (\d+)\. ", text, flags=re.M)
    found = {0: parts[0]} | {int(n): body for n, body in zip(parts[1::2], parts[2::2])}
    return {n: " ".join(body.split()) for n, body in found.items()}


def answer(chapter: str, n: int) -> str:
    """The text of answer `n` in the chapter's key (from its '## n.' heading to the next heading)."""
    found = sections(chapter)
    assert n in found, f"instructors/answers/{chapter}.md has no answer '## {n}.'"
    return found[n]


def says(chapter: str, n: int, *strings: str) -> None:
    """Answer `n` of the chapter states each string (a number formatted as the key writes it, with its unit or
    words around it); the numbers in them count as checked for the audit at the end of the file."""
    text = answer(chapter, n)
    for s in strings:
        assert s in text, f"answer {n} of {chapter} should say {s!r} (computed from the code or the results)"
        CHECKED[chapter, n] |= numbers(s)


def package(chapter: str) -> str:
    return next(c for c in chapters() if c.split("_")[0] == chapter)


def question_texts(package: str) -> dict[int, str]:
    """The thought questions of a chapter's README, by number (their points left out: a number the key states is
    not given by them)."""
    return {q.number: q.text for q in written.questions(package)}


def questions(package: str) -> int:
    """How many thought questions the chapter's README asks."""
    return len(question_texts(package))


@pytest.mark.parametrize("package", [c for c in chapters()
                                     if "**Thought questions**" in (REPO_ROOT / c / "README.md").read_text()])
def test_every_thought_question_has_an_answer(package: str):
    chapter = package.split("_")[0]
    assert (KEYS / f"{chapter}.md").is_file(), f"no answer key instructors/answers/{chapter}.md"
    assert sorted(question_texts(package)) == list(range(1, questions(package) + 1)), "README questions renumbered?"
    for n in range(1, questions(package) + 1):
        assert len(answer(chapter, n)) > 200
    assert not re.search(rf"^## {questions(package) + 1}\. ", (KEYS / f"{chapter}.md").read_text(), re.M), \
        "the key answers more questions than the README asks (renumbered?)"


def test_keys_cite_sources_by_name():
    for key in KEYS.glob("*.md"):
        text = key.read_text()
        assert not re.search(r"\bseed 0\d\d\b|\bBug \d\b|\bissue \d+\b|DESIGN\.md", text, re.I), key.name


# ---------------------------------------------------------------- shared


@functools.cache
def _smollm2():
    """SmolLM2's config and parameter count, read from the GGUF header (no weights converted)."""
    gguf = pytest.importorskip("gguf")
    from step01_kvcache.pretrained import config_from_gguf, gguf_path

    reader = gguf.GGUFReader(gguf_path())
    return config_from_gguf(reader), sum(int(t.n_elements) for t in reader.tensors)



def _h200_sweep() -> dict:
    return json.loads((REPO_ROOT / "step06_triton" / "results" / "h200_sweep.json").read_text())["sweep"]



def _figures(chapter: str, workload: str) -> dict:
    """A committed run of a chapter's bench (`python -m course bench stepNN --workload W --save`)."""
    return results.load(chapter, workload)["figures"]


def _hash_hit(a: list[int], b: list[int], block_size: int = 16) -> int:
    """Tokens of `b` that chapter 3's chained block hashes find once `a` is cached."""
    from step03_prefix_hash.block_hash import hash_token_blocks

    hits = 0
    for ha, hb in zip(hash_token_blocks(a, block_size), hash_token_blocks(b[:-1], block_size)):  # last token: computed
        if ha != hb:
            break
        hits += 1
    return hits * block_size


def _long_on_the_gpu() -> tuple[int, int]:
    """Chapter 6's `long` workload: (prompt tokens, tokens a warm request computes past its cached blocks)."""
    from benchmarks.step06.engine import workload

    prompts, _ = workload("long", SMOLLM2_135M["vocab_size"])
    shared = next(i for i, (x, y) in enumerate(zip(prompts[0], prompts[1])) if x != y)
    return len(prompts[1]), len(prompts[1]) - shared // 16 * 16  # the engine's 16-token blocks


# ---------------------------------------------------------------- chapter 1


def test_step01_q1_cache_memory():
    cfg, params = _smollm2()
    tokens = 8192  # the question's context
    fp32_bytes, bf16_bytes = torch.float32.itemsize, torch.bfloat16.itemsize
    per_token = cfg.kv_bytes_per_token()
    elements = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim  # K and V
    assert per_token == elements * fp32_bytes
    fp32 = KVCache(cfg, tokens, torch.float32, "meta").nbytes()
    bf16 = KVCache(cfg, tokens, torch.bfloat16, "meta").nbytes()
    assert fp32 == tokens * per_token
    weights = params * fp32_bytes
    says("step01", 1, f"2 × {cfg.num_layers} layers × {cfg.num_kv_heads} KV heads × {cfg.head_dim} dims = {elements:,}",
         f"**{per_token:,} bytes ({per_token / 1024:g} KiB) per token in fp32**",
         f"{per_token // fp32_bytes * bf16_bytes / 1024:g} KiB in bf16",
         f"{tokens:,} × {per_token:,} = {fp32:,} bytes = **{fp32 // 2**20} MiB**", f"`KVCache(cfg, {tokens}).nbytes()`",
         f"In bf16: **{bf16 // 2**20} MiB**",
         f"{params:,} parameters × {fp32_bytes} bytes = {weights:,} bytes ≈ {weights / 2**20:.0f} MiB",
         f"**{math.ceil(weights / per_token):,} tokens**",
         f"({weights:,} / {per_token:,} = {weights / per_token:,.1f})",
         f"({cfg.num_kv_heads} KV heads for {cfg.num_heads} query heads) this is "
         f"{cfg.num_heads // cfg.num_kv_heads}× later")


def test_step01_q4_token_forwards():
    _, params = _smollm2()
    model = tiny_model(seed=0)
    counted: list[int] = []
    model.register_forward_pre_hook(lambda module, args: counted.append(len(args[0])))
    p, m = 38, 32  # the question's
    prompt = list(range(1, p + 1))
    totals = {}
    for cache in (False, True):
        counted.clear()
        out = generate(model, prompt, SamplingParams(max_new_tokens=m, **GREEDY), use_cache=cache)
        assert len(out) == m
        totals[cache] = sum(counted)
    assert totals == {False: m * p + m * (m - 1) // 2, True: p + m - 1}  # the key's two formulas
    measured = _figures("step01", "single")
    assert (measured["prompt_tokens"], measured["new_tokens"]) == (p, m), "the measured ratio is for another p, m"
    says("step01", 4, "`Σ (p + j − 1) = m·p + m(m − 1)/2`", "`p + m − 1`", f"**{totals[False]:,}**",
         f"**{totals[True]}**", f"{totals[False] / totals[True]:.1f}", f"**{measured['speedup_cache']}**",
         f"the {params * 4 / 2**20:.0f} MiB of weights", f"a {p + m - 1}-token forward (the longest without the cache)")


def test_step01_q6_reserved_memory():
    from step02_paged.geometry import cdiv

    reserved, used, block = 8192, 600, 16  # the question's
    blocks = cdiv(used, block)
    slots = blocks * block
    says("step01", 6, f"{used} / {reserved:,} = **{used / reserved:.1%}**".replace("%", " %"),
         f"{blocks} blocks (`⌈{used}/{block}⌉`) = {slots} slots (at most {block - 1} wasted)",
         f"{reserved:,} / {slots} = **{reserved / slots:.1f} times**",
         f"≈ {reserved / slots - 1:.1f} more per reserved seat")


# ---------------------------------------------------------------- chapter 2


def test_step02_q1_bytes_per_block():
    from step02_paged.geometry import cdiv
    from step02_paged.kv_pool import KVPool

    cfg, _ = _smollm2()
    size = {bs: KVPool(cfg, PoolGeometry(1, bs), device="meta").bytes_per_block  # the question's sizes
            for bs in (1, 16, 256)}
    says("step02", 1, f"costs {cfg.kv_bytes_per_token():,} bytes of K and V in fp32 (all {cfg.num_layers} layers)",
         f"**{size[1]:,} bytes ({size[1] / 1024:g} KiB)** at `block_size` 1",
         f"**{size[16]:,} bytes ({size[16] / 1024:g} KiB)** at 16",
         f"**{size[256]:,} bytes ({size[256] / 2**20:g} MiB)**",
         f"slots, so {1 - 1}, {16 - 1} and {256 - 1} tokens", f"accepting up to {16 - 1} tokens of waste")
    n = 2000  # the key's example of a sequence
    says("step02", 1, f"{cdiv(n, 1):,} entries for a {n:,}-token sequence at size 1")
    agree = 250  # the key's example: two prompts that agree on fewer tokens than one large block
    a, b = list(range(1, 301)), list(range(1, agree + 1)) + list(range(1000, 1050))
    assert _hash_hit(a, b, 256) == 0 and _hash_hit(a, b, 16) == agree // 16 * 16
    says("step02", 1, f"agree on {agree} tokens share nothing at `block_size` 256")


def test_step02_q2_the_preempted_sequences_tokens():
    from step02_paged.engine import Engine, EngineConfig

    sampled = 5  # the question's
    prompt = [5, 6, 7, 8, 9, 10, 11]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
    outputs = {}
    for preempt in (False, True):
        engine = Engine(tiny_model(seed=0), EngineConfig(num_blocks=64, block_size=4))
        seq = engine.seqs[engine.add_request(prompt, params)]
        while len(seq.output_ids) < sampled:
            engine.step()
        if preempt:
            lost = seq.num_computed_tokens - len(prompt)  # sampled tokens whose K/V are in the pool
            engine.scheduler.running.remove(seq)
            engine.scheduler._preempt(seq)  # what `schedule` does to its victim
            engine.block_table.release(seq.seq_id)  # and what `step` does after it
            assert (len(seq.output_ids), seq.block_table) == (sampled, [])
            pending, restart = seq.num_pending_tokens - len(prompt), seq.num_computed_tokens
        while engine.has_unfinished():
            engine.step()
        outputs[preempt] = list(seq.output_ids)
    assert outputs[True] == outputs[False], "a seeded, sampled answer is unchanged by the preemption"
    assert (lost, pending) == (sampled - 1, sampled)
    says("step02", 2, f"(the {sampled} sampled tokens stay", f"sets `num_computed_tokens` to {restart}",
         f"`num_pending_tokens = prompt + {pending}`",
         f"the {lost} earlier tokens", f"the {sampled}th sampled token", f"samples the {sampled + 1}th token",
         f"until token {sampled + 1}", f"the {sampled + 1}th draw", f"the {sampled} tokens would be sampled again")


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
    says("step02", 3, f"**{len(chunks)} steps**", " + ".join(map(str, chunks)), f"carries ~{chunks[0]} prefill tokens",
         f"TTFT: {len(chunks)} steps")


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
    assert steps == max(lengths)
    says("step02", 7, f"**{sum(lengths)}**", f"{len(lengths)} × {steps} = {len(lengths) * steps:,}",
         f"**{len(lengths) * steps - sum(lengths)}**", f"**{seat_steps - sum(lengths)}** seat-steps")


def test_step02_q8_block_table_rewrites():
    from benchmarks.step02.host import CONTEXTS, SEQS

    assert f"{SEQS} sequences of {CONTEXTS[-1]:,} tokens" in question_texts("step02_paged")[8], "the host bench's"
    longest, shortest = CONTEXTS[-1], CONTEXTS[0]
    row = cdiv(longest, 16)
    says("step02", 8, f"{longest:,}-token sequence's row has {row:,} entries",
         f"{SEQS} × {row:,} = **{SEQS * row:,} entries per step**", f"{SEQS} / 16 = **{SEQS // 16} entries per step**",
         f"**{SEQS * longest:,} per step**, against **{SEQS}**", f"{longest // shortest} times more at {longest:,}",
         f"than at {shortest}", f"({SEQS * cdiv(shortest, 16):,} entries per step at block size 16)")


def test_step03_q2_a_repeated_32_token_prompt():
    from step02_paged import Engine, EngineConfig
    from step02_paged.kv_pool import KVPool
    from step03_prefix_hash import PrefixCachingKVCacheManager

    block = 16
    engine = Engine(tiny_model(seed=0), EngineConfig(num_blocks=64, block_size=block), PrefixCachingKVCacheManager)
    prompt = list(range(10, 42))
    hits = []
    for _ in range(2):
        engine.add_request(prompt, SamplingParams(max_new_tokens=1, **GREEDY))
        while engine.has_unfinished():
            hits += [out.num_cached_tokens for out in engine.step()]
    assert hits[0] == 0
    hit = hits[1]
    assert hit == (len(prompt) - 1) // block * block
    cfg = ModelConfig(**SMOLLM2_135M)
    says("step03", 2, f"**{hit}**", f"recomputes **{len(prompt) - hit}**",
         f"`({len(prompt)} − 1) // {block} = {(len(prompt) - 1) // block}` block",
         f"{KVPool(cfg, PoolGeometry(1, block), device='meta').bytes_per_block // 1024} KiB for SmolLM2 in fp32 "
         f"at {block} tokens")


def test_step03_q4_eight_requests_with_one_new_prefix():
    from step02_paged import Engine, EngineConfig
    from step03_prefix_hash import PrefixCachingKVCacheManager

    block = 16
    model = tiny_model(seed=0, max_position_embeddings=2048)
    engine = Engine(model, EngineConfig(num_blocks=1024, block_size=block, max_num_seqs=8,
                                        max_num_batched_tokens=8192), PrefixCachingKVCacheManager)
    prefix = [(7 * i) % 250 + 1 for i in range(1000)]
    ids = [engine.add_request(prefix + [i + 1], SamplingParams(max_new_tokens=2, **GREEDY)) for i in range(8)]
    engine.step()  # all eight admitted and prefilled in one step
    seqs = [engine.seqs[i] for i in ids]
    assert all(s.num_cached_tokens == 0 for s in seqs), "nothing was published when they were admitted"
    bm = engine.cache_manager.block_manager
    full = len(prefix) // block
    published = {b for s in seqs for b in s.block_table[:full] if bm.entries[b] is not None}
    private = [b for s in seqs for b in s.block_table[:full] if bm.entries[b] is None]
    assert len(published) == full
    says("step03", 4, f"**{len(seqs)} times**", "**one copy**", f"At {block}-token blocks that is {full} cached blocks",
         f"{len(seqs) - 1} × {full} = {len(private)}")


def test_step03_q6_hashing_against_prefill():
    run = _figures("step03", "long")
    sha = 2000 * run["hash_us_per_token"] / 1000  # ms for the question's 2,000 tokens
    builtin = 2000 * run["hash_builtin_us_per_token"] / 1000
    ratio = run["ttft_cold_off_s"] * 1000 / sha
    gpu_prompt, _ = _long_on_the_gpu()
    gpu_ms = engine_report.load()["smollm2_135m"]["long"]["cache_off"]["warm_median_ms"]
    says("step03", 6, f"{run['hash_us_per_token']} µs", f"**{sha:.2f} ms**", f"{builtin:.3f} ms",
         f"{run['hash_builtin_us_per_token']} µs per token", f"{run['ttft_cold_off_s']:.1f} s",
         f"**{round(ratio, -4):,.0f} times**",
         f"a {gpu_prompt:,}-token prompt without the cache takes {gpu_ms:.1f} ms",
         f"**{sha / gpu_ms:.1%}**".replace("%", " %"), f"has {sys.hash_info.width} bits")


# ---------------------------------------------------------------- chapter 4


def _twenty_shared_tokens() -> tuple[list[int], list[int]]:
    """Two 32-token prompts that share their first 20 tokens."""
    return list(range(1, 33)), list(range(1, 21)) + list(range(100, 112))


def test_step04_q1_twenty_shared_tokens():
    from step04_radix.radix_tree import RadixTree

    a, b = _twenty_shared_tokens()
    block = 16
    tree = RadixTree()
    tree.insert(a, list(range(32)))
    token_hit = len(tree.match_prefix(b)[0])
    tree.insert(b, list(range(32, 64)))
    upper = tree.root.children[a[0]]
    assert len(upper.key) == token_hit and set(upper.children) == {a[token_hit], b[token_hit]}
    says("step04", 1, f"reuses **{_hash_hit(a, b, block)}**", f"all **{token_hit}**", f"[0, {len(upper.key)})",
         f"Block 0 (tokens 0–{block - 1})", f"block 1 covers tokens {block}–{2 * block - 1}",
         f"every token up to {len(b) - 1}", f"tokens {token_hit}–{len(b) - 1}, which differ",
         f"Tokens {block}–{token_hit - 1} are shared")


def test_step04_q3_what_a_block_boundary_costs():
    a, b = _twenty_shared_tokens()
    says("step04", 3, f"**{20 - _hash_hit(a, b)}** of the 20")


def _multi_doc_admissions(policy: str, pool: str) -> tuple[list[str], list[int]]:
    """Admission order of `multi_doc` as the chapter's policy bench runs it (two seats), on a tiny model (which
    request runs when depends on token counts only, not on the weights), and how many times each document was
    computed (by a request that found less than half its prompt cached)."""
    from benchmarks.step04.policies import pools, run_policy
    from benchmarks.step04.report import request_label
    from course.workloads import MULTI_DOC_DOCUMENTS, get_workload
    from step01_kvcache.pretrained import load_tokenizer
    from step04_radix import RadixKVCacheManager
    from step04_radix.policy import make_policy

    prompts = get_workload("multi_doc").prompts(load_tokenizer())
    model = tiny_model(seed=7, vocab_size=49152, max_position_embeddings=4096, num_layers=1, hidden_size=32,
                       intermediate_size=32, head_dim=8)
    kv = RadixKVCacheManager(PoolGeometry(pools(prompts, 4)[pool], 1))
    run = run_policy(model, prompts, (lambda *_: kv, 1), make_policy(policy), pools(prompts, 4)[pool], 4)
    computed = [0] * MULTI_DOC_DOCUMENTS
    for seq_id, prompt_tokens, hit in kv.stats.recent:
        computed[seq_id % MULTI_DOC_DOCUMENTS] += hit < prompt_tokens // 2
    return [request_label(i) for i in run["admission_order"]], computed


def test_step04_q7_lpm_on_multi_doc():
    (fcfs, fcfs_docs), (lpm, lpm_docs) = _multi_doc_admissions("fcfs", "tight"), _multi_doc_admissions("lpm", "tight")
    assert _multi_doc_admissions("lpm", "roomy")[0] == lpm
    assert set(fcfs_docs) == {3} and set(lpm_docs) == {1}
    says("step04", 7, f"**{' '.join(fcfs[:6])}**", f"**{' '.join(lpm[:6])}**", "**three times**", "**once**",
         f"**{lpm.index('D1') + 1}th**", f"**{fcfs.index('D1') + 1}th**")


def test_step04_q8_eight_questions_about_a_new_document():
    from step02_paged import Engine, EngineConfig
    from step04_radix import RadixKVCacheManager
    from step04_radix.policy import LongestPrefixMatch

    document = list(range(100, 160))
    engine = Engine(tiny_model(seed=1), EngineConfig(num_blocks=4096, block_size=1, max_num_seqs=8,
                                                     max_num_batched_tokens=1024), RadixKVCacheManager,
                    policy=LongestPrefixMatch())
    outs = [engine.add_request(document + [200 + i], SamplingParams(max_new_tokens=2)) for i in range(8)]
    engine.step()
    computed = sum(n for _, n in engine.last_scheduled)
    assert len(engine.last_scheduled) == len(outs) and computed == len(outs) * (len(document) + 1)
    says("step04", 8, "**Eight times.**")


# ---------------------------------------------------------------- chapter 5


def test_step05_q1_split_deep_in_the_tree():
    from step05_bridge.block_radix_tree import BlockRadixTree

    start, end, cut, B = 40, 90, 40 + 30, 16  # the question's edge, split and block size
    tree = BlockRadixTree(B)
    head, tail = tree.span(start, cut), tree.span(cut, end)
    assert head + tail == tree.span(start, end)
    first = start // B
    blocks = list(range(first, end // B))
    assert len(blocks) == tree.span(start, end)
    tokens = ", ".join(f"{i * B}–{(i + 1) * B - 1}" for i in blocks)
    says("step05", 1, f"`{end} // {B} − {start} // {B} = {tree.span(start, end)}` blocks, the path's blocks "
         f"{', '.join(map(str, blocks[:-1]))} and {blocks[-1]} (tokens {tokens})",
         f"the head covers [{start}, {cut})", f"**{head} blocks, the path's blocks {first} and {first + 1}**",
         f"(`{cut} // {B} − {start} // {B}`)", f"the tail covers [{cut}, {end})",
         f"**{tail} block, the path's block {first + head}**", f"(`{end} // {B} − {cut} // {B}`)",
         f"Tokens {end // B * B}–{end - 1} are in the tree")


def test_step05_q3_copy_on_write_on_diverge():
    matched, B = 125, 16  # the question's
    full = matched // B
    bridge, radix, hashed = (_figures(c, "diverge") for c in ("step05", "step04", "step03"))
    shared, warm = bridge["hf_shared_prefix_tokens"], bridge["requests"] - 1
    assert bridge["block_size"] == B
    assert (hashed["cached_tokens"], radix["cached_tokens"]) == (warm * (shared // B * B), warm * shared), \
        "the warm requests of `diverge` no longer hit exactly their shared prefix"
    says("step05", 3, f"uses {full} full blocks ({full * B} tokens)",
         f"the block holding tokens {full * B}–{(full + 1) * B - 1}",
         f"share {shared} tokens, {B}-token blocks reuse {shared // B * B}", f"reuse all {shared}",
         f"the radix tree's {radix['hit_rate']:.2f} hit rate instead of the hash's {hashed['hit_rate']:.2f}")


def test_step05_q6_bookkeeping_against_a_warm_request():
    long = _figures("step05", "long")
    B = long["block_size"]
    row = next(d for d in _figures("step05", "designs")["designs"] if d["workload"] == "long")
    bridge, hashed = row[f"bridge bs={B}"]["bookkeeping_us"], row[f"hash bs={B}"]["bookkeeping_us"]
    warm_ms = long["ttft_on_warm_median_s"] * 1e3
    says("step05", 6, f"**{bridge:.0f} µs** of cache bookkeeping per warm `long` request at {B}-token blocks",
         f"the hash's: {hashed:.0f} µs", f"**{warm_ms:.0f} ms**",
         f"**{bridge / 1e3 / warm_ms:.2%}**".replace("%", " %"))


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
    says("step05", 7, f"**{bridge_refs:,}**", f"**{radix_locks}** lock references", f"`lock_ref` {radix_locks}",
         f"`ref_count` {bridge_refs // len(prompt)}")


def test_step05_q8_the_textbook_split_repaired():
    from step05_bridge.block_radix_tree import BlockRadixTree

    first, second = list(range(1, 49)), list(range(1, 21)) + list(range(100, 112))  # they part at token 20
    cut, B = 20, 16
    tree = BlockRadixTree(B)
    tree.insert(first, [100, 101, 102])
    reused, _ = tree.match_prefix(second)
    tree.insert(second, reused + [200])
    upper = tree.root.children[first[0]]
    mine, theirs = upper.children[first[cut]], upper.children[second[cut]]
    assert (len(upper.key), len(mine.key), len(theirs.key)) == (cut, 28, 12)
    assert (tree.span(0, cut), tree.span(cut, 48), tree.span(cut, 32)) == (len(upper.value), len(mine.value),
                                                                         len(theirs.value))
    repeat, _ = tree.match_prefix(first + [999])
    offset = len(upper.key) % tree.block_size  # where the first prompt's branch starts inside block 101
    says("step05", 8, f"the upper node holds tokens 0–{cut - 1} and **block {upper.value[0]}**",
         f"`span(0, {cut}) = {tree.span(0, cut)}`", f"holds tokens {cut}–{len(first) - 1} and "
         f"**blocks {mine.value[0]} and {mine.value[1]}**", f"`span({cut}, {len(first)}) = {tree.span(cut, 48)}`",
         f"holds tokens {cut}–{len(second) - 1} and **block {theirs.value[0]}**",
         f"`span({cut}, {len(second)}) = {tree.span(cut, 32)}`", f"**offset {offset}** of block {mine.value[0]}",
         f"{offset} = {cut} % {B}", f"block {mine.value[0]}'s last token, {(cut // B + 1) * B - 1},",
         f"all **{len(repeat) * B}** tokens instead of {len(reused) * B}", f"**{cut - len(reused) * B}** of the 20",
         f"({len(reused) * B}–{cut - 1}) into block {theirs.value[0]}")


def test_step05_q9_loading_or_recomputing():
    import inspect

    from step05_bridge import BridgeKVCacheManager

    s = SMOLLM2_135M
    h, kv = s["hidden_size"], s["num_kv_heads"] * s["head_dim"]
    per_layer = 2 * h * s["num_heads"] * s["head_dim"] + 2 * h * kv + 3 * h * s["intermediate_size"] + 2 * h
    params = s["num_layers"] * per_layer + h  # outside the embedding (a prompt token looks its row up)
    assert round(params / 1e8, 2) == 1.06, params
    flops_per_token = 2 * 1.06e8  # the question's
    rates = engine_report.load()["smollm2_135m"]["host_tier"]["rates"]
    matmul = step06_report.load()["kernels"]["ceilings"]["matmul_tflop_s"]
    load = rates["h2d_gb_s"] * 1e9 / rates["kv_bytes_per_token"]
    assert abs(load - rates["load_tokens_s"]) / load < 0.01
    assert rates["kv_bytes_per_token"] == 2 * s["num_layers"] * s["num_kv_heads"] * s["head_dim"] * 2  # K, V in bf16
    need = load * flops_per_token / 1e12
    prefill = rates["prefill_tokens_s"] * flops_per_token / 1e12
    least = inspect.signature(BridgeKVCacheManager.__init__).parameters["min_load_tokens"].default
    says("step05", 9, f"{rates['kv_bytes_per_token']:,} bytes", f"at {rates['h2d_gb_s']} GB/s",
         f"**{load:,.0f} tokens/s**", f"{load:,.0f} × {flops_per_token / 1e8:g} × 10⁸ FLOPs per second",
         f"**{need:.0f} TFLOP/s**", f"**{need / matmul:.0%}**", f"{rates['prefill_tokens_s']:,} tokens/s",
         f"about {prefill:.0f} TFLOP/s, {prefill / matmul:.1%} of the matmul rate",
         f"**{load / rates['prefill_tokens_s']:.0f}x**", f"{matmul} TFLOP/s",
         f"through {SMOLLM2_135M['num_layers']} layers", f"`min_load_tokens = {least}` ({least // 16} blocks)")


# ---------------------------------------------------------------- chapter 6


def test_step05_q10_a_rollback_across_a_block_boundary():
    from step02_paged.geometry import PoolGeometry, cdiv
    from step02_paged.kv_cache_manager import KVCacheManager
    from step03_prefix_hash import PrefixCachingKVCacheManager
    from step05_bridge.pictures import verify_step
    from step05_bridge.rollback import rollback as rollback_tokens

    bs, computed, k = 16, 46, 4
    drafts = [1000 + i for i in range(k)]

    def decoding(kv):
        """A sequence with `computed` tokens computed and its last sampled one (position `computed`) pending."""
        seq = kv.new_sequence(0, list(range(computed + 1)), SamplingParams(max_new_tokens=64, **GREEDY))
        assert kv.allocate_slots(seq, computed)
        seq.admit(0)
        seq.advance(computed)
        kv.on_computed(seq)
        return seq

    kv = KVCacheManager(PoolGeometry(8, bs))
    seq = decoding(kv)
    before = len(seq.block_table)
    table, counted = verify_step(kv, seq, drafts, [7])  # the model disagrees with the first draft
    last = len(table) - 1
    assert counted == computed + k + 1 and len(seq.block_table) == last and kv.block_manager.ref_count[table[last]] == 0
    says("step05", 10, f"**{k + 1} positions**, {computed}-{computed + k}", f"Position {computed + k} lies in",
         f"block {last} of the table (positions {last * bs}-{(last + 1) * bs - 1})", f"holds **{len(table)} blocks**",
         f"({before} before it", f"from {computed} to **{counted}**", f"the counter to **{seq.num_computed_tokens}**",
         f"need {len(seq.block_table)} blocks", f"block {last} held only the rejected drafts of positions "
         f"{last * bs}-{computed + k}", f"Slot {seq.num_computed_tokens} (in block {seq.num_computed_tokens // bs})",
         f"reads the first {seq.num_computed_tokens} positions")
    kv = KVCacheManager(PoolGeometry(8, bs))
    seq = decoding(kv)
    verify_step(kv, seq, drafts, [drafts[0], 7])  # the first draft stands, the second does not
    c = seq.num_computed_tokens
    assert len(seq.block_table) == len(table) and c // bs == last
    says("step05", 10, f"goes back to **{c}**", f"sits at position {c}, in block {last}", f"Slot {c} now holds",
         f"slots {c + 1} and {computed + k} hold drafts")
    for rollback in (False, True):  # chapter 3, with and without the rollback: which blocks are published
        kv = PrefixCachingKVCacheManager(PoolGeometry(8, bs))
        seq = decoding(kv)
        seq.spec_token_ids = list(drafts)
        assert kv.allocate_slots(seq, k + 1)
        seq.advance(k + 1)
        seq.spec_token_ids = []
        if rollback:
            rollback_tokens(seq, k)
        kv.on_computed(seq)
        seq.append_token(7)
        kv.on_computed(seq)
        published = [i for i, b in enumerate(seq.block_table) if kv.block_manager.entries[b] is not None]
        if not rollback:
            stale = published[-1]
            assert stale * bs <= computed + 1 <= (stale + 1) * bs, "the last published block holds slot 47"
            says("step05", 10, f"stay at {seq.num_computed_tokens} while the sequence has {seq.num_tokens} tokens",
                 f"block {stale} (positions {stale * bs}-{(stale + 1) * bs - 1}) is full",
                 f"a counter of {seq.num_computed_tokens} says", f"starts with these {seq.num_tokens} tokens")
        else:
            assert stale not in published
            says("step05", 10, f"the counter says {seq.num_computed_tokens}, and block {stale} waits",
                 f"writes position {seq.num_computed_tokens}")
    assert cdiv(computed + 1, bs) == before


# ---------------------------------------------------------------- chapter 3


def test_step06_q1_intensity_and_ridge():
    c = step06_report.load()["kernels"]["ceilings"]
    hq, hkv, d = SMOLLM2_135M["num_heads"], SMOLLM2_135M["num_kv_heads"], SMOLLM2_135M["head_dim"]
    bf16 = torch.bfloat16.itemsize
    grouped = 4 * hq * d / (2 * hkv * d * bf16)  # FLOPs over the bytes of K and V, per token and layer
    alone = 4 * d / (2 * bf16 * d)  # one query head per program: every program reads its KV head again
    assert grouped == hq / hkv
    engine_copy = engine_report.load()["smollm2_135m"]["random"]["decode"]["copy_tb_s"]
    plain_loop = 4.3  # TB/s, a plain device-to-device copy loop on the H200 (the device tool's notes; H200.md)
    assert max(c["copy_tb_s"], engine_copy) < 0.8 * plain_loop, "the key says both copy probes read low: reword it"
    says("step06", 1, f"`2 · H_kv · D` elements of {bf16} bytes", "`4 · H_q · D` FLOPs",
         f"**{grouped:g} FLOP/byte** for SmolLM2 ({hq} query / {hkv} KV heads)",
         f"`4 · D` FLOPs per `2 · {bf16} · D` bytes, **{alone:g} FLOP/byte**",
         f"read {c['copy_tb_s']} TB/s, the engine run's {engine_copy:.2f}", f"against the {plain_loop} TB/s",
         f"ridge near {c['matmul_tflop_s'] / plain_loop:.0f})",
         f"**{c['matmul_tflop_s'] / c['copy_tb_s']:.0f} FLOP/byte**")


def test_step06_q2_splitting_a_ragged_batch():
    from benchmarks.step06.kernels import RAGGED, ragged_lengths
    from step06_triton.decode_attention import DECODE_TILE, FILL_PER_SM, MIN_SPLIT_LEN, PROGRAMS_PER_SM, split_plan_host

    res = step06_report.load()["kernels"]
    sms = res["machine"]["sms"]
    row = next(r for r in res["decode"] if r["ragged"] and r["heads"] == "32/8x128" and r["block_size"] == 16)
    uniform = next(r for r in res["decode"]
                   if not r["ragged"] and (r["batch"], r["context"], r["block_size"]) == (64, 4096, 16))
    hkv, tile = row["hkv"], DECODE_TILE[row["d"]][0]
    lengths = ragged_lengths(RAGGED["batch"], 1, RAGGED["max_context"], RAGGED["seed"])
    assert sum(lengths) == row["total_tokens"], "the bench's ragged batch is not the JSON's"
    assert min(lengths) * 5 < max(lengths) * 4, "the key says the batch is ragged to the rule"
    longest = max(lengths)
    split_len = max(MIN_SPLIT_LEN, -(-sum(lengths) * hkv // (PROGRAMS_PER_SM * sms)))
    plan = split_plan_host(lengths, hkv, row["max_splits"], tile, sms)
    splits, per_split = plan[lengths.index(longest)]
    tiles = -(-longest // tile)
    assert sum(n for n, _ in plan) * hkv == row["programs"], "the Python rule and the JSON disagree"
    first_programs = len(lengths) * hkv
    assert row["first_rule_splits"] == 1 == FILL_PER_SM * sms // first_programs
    assert uniform["programs"] == first_programs and FILL_PER_SM * sms // uniform["programs"] == 1
    sweep = {r["per_sm"]: r["tb_s"] for r in _h200_sweep()["decode"] if r["heads"] == "32/8x128"
             and r["batch"] == "ragged" and r["block_n"] in (None, 64) and r["warps"] in (None, 4)}
    assert set(split_plan_host([4096] * 64, 8, uniform["max_splits"], 64)) == {(1, 4096)}
    says("step06", 2, f"**{sum(lengths):,} tokens**", f"from {min(lengths):,} to {longest:,}",
         f"with {hkv} KV heads and {PROGRAMS_PER_SM} programs per SM on {sms} SMs",
         f"`split_len = max({MIN_SPLIT_LEN}, ⌈{sum(lengths):,} · {hkv} / {PROGRAMS_PER_SM * sms:,}⌉)` = "
         f"**{split_len} tokens**", f"⌈{longest:,} / {split_len}⌉ = {-(-longest // split_len)} pieces",
         f"whole {tile}-token tiles ({tiles} tiles, {-(-tiles // splits)} per split)",
         f"**{splits} splits** of {per_split} tokens", f"**{row['programs']:,} programs**",
         f"({sum(n for n, _ in plan)} splits times {hkv} KV heads), none longer than "
         f"{max(p for _, p in plan):,} tokens", f"{len(lengths)} · {hkv} = **{first_programs} programs**",
         f"not under {FILL_PER_SM} per SM ({FILL_PER_SM * sms})", f"the longest walks {longest:,} tokens",
         f"the average context is {round(sum(lengths) / len(lengths)):,}",
         f"**{row['triton_first_rule_tb_s']} TB/s**", f"**{row['triton_tb_s']} TB/s**",
         f"**{' / '.join(str(sweep[k]) for k in sorted(sweep))} TB/s** at {' / '.join(map(str, sorted(sweep)))} "
         f"programs per SM", f"sweep of the target shows why {PROGRAMS_PER_SM} per SM",
         f"its {uniform['programs']} programs give `{FILL_PER_SM} · {sms} // {uniform['programs']} = 1`, **one split**",
         f"**{uniform['triton_tb_s']} TB/s** (the first version: {uniform['first_version_tb_s']})")


def test_step06_q4_contiguous_bytes_per_head_and_block():
    row = next(r for r in step06_report.load()["kernels"]["decode"] if r["heads"] == "32/8x128")
    block, d, bf16 = row["block_size"], row["d"], torch.bfloat16.itemsize
    says("step06", 4, f"**{block * d * bf16:,} bytes** at block {block}, head_dim {d} in bf16, against "
                      f"{1 * d * bf16} bytes at block 1")


def test_step06_q5_the_bytes_read_back():
    says("step06", 5, f"`q · H_kv · D · {torch.bfloat16.itemsize}` bytes per layer")


def test_step06_q6_an_empty_context():
    from step06_triton.decode_attention import split_plan_host

    assert split_plan_host([0, 100], 1, 4) == [(1, 64), (1, 128)]
    says("step06", 6, "**one split**", "**zeros**")


def test_step06_q7_the_two_loops_from_their_parts():
    from benchmarks.step06.engine import floor_us
    e = engine_report.load()
    d, big = e["smollm2_135m"]["random"]["decode"], e["llama_3_2_1b"]["random"]["decode"]
    fastest = step06_report.fastest_copy(step06_report.load())
    step, gpu = d["sync"]["host_ms_per_step"], d["sync"]["gpu_ms_per_step"]
    host = step - gpu
    overlap = d["overlap"]
    per_kernel = d["gpu_us_per_step"] / d["kernels_per_step"]
    assert overlap["gpu_ms_per_step"] > host, "the key says the GPU is now the longer part on SmolLM2"
    assert big["gpu_us_per_step"] / floor_us(big, fastest) < d["gpu_us_per_step"] / floor_us(d, fastest), \
        "the key says the 1B shape's replay is much nearer its floor"
    says("step06", 7, f"**{step} ms**", f"**{gpu} ms**", f"**{host:.2f} ms**",
         f"**{max(host, overlap['gpu_ms_per_step']):.2f} ms**",
         f"{overlap['decode_wall_ms']} ms over {overlap['decode_steps']} steps",
         f"**{overlap['decode_wall_ms'] / overlap['decode_steps']:.2f} ms**",
         f"{d['gpu_us_per_step']} µs against a floor of {floor_us(d, fastest)} µs",
         f"at the fastest copy the kernel runs made on an H200, {fastest} TB/s",
         f"{big['gpu_us_per_step']} µs against a floor of {floor_us(big, fastest)} µs",
         f"{d['kernels_per_step']} kernels at **{per_kernel:.1f} µs**",
         f"**{floor_us(d, fastest) / per_kernel:.0f} kernels**", f"this run's own probe read {d['copy_tb_s']:.1f}")
    assert 1 < floor_us(d, fastest) / per_kernel / SMOLLM2_135M["num_layers"] < 2, "the key says one or two per layer"


def test_step06_q9_the_warm_requests_floor():
    from benchmarks.step06.engine import cold_ms, warm_split
    e = engine_report.load()
    sms = step06_report.load()["kernels"]["machine"]["sms"]
    d, long = e["smollm2_135m"]["random"]["decode"], e["smollm2_135m"]["long"]
    per_kernel = d["gpu_us_per_step"] / d["kernels_per_step"]
    prompt, new = _long_on_the_gpu()
    assert round(prompt / new, 1) == long["token_bound"], "the token bound is not the workload's prompt / new tokens"
    gpu_us, host_us = warm_split(long)
    says("step06", 9, f"**{gpu_us} µs**", f"{host_us} µs of host work",
         f"step's ({d['kernels_per_step']})", f"at {per_kernel:.1f} µs each",
         f"**{d['kernels_per_step'] * per_kernel / 1e3:.1f} ms**", f"not the {new} tokens",
         f"{cold_ms(long['cache_on'])} ms", f"token bound ({long['token_bound']}x)",
         f"**{cold_ms(long['cache_on']) / long['token_bound']:.2f} ms**",
         f"for a {new}-token chunk ({SMOLLM2_135M['num_heads']} programs per layer on {sms} SMs)")


def test_step06_q10_bytes_with_and_without_cascade():
    cfg, layers = SMOLLM2_135M, SMOLLM2_135M["num_layers"]
    per_layer = 2 * cfg["num_kv_heads"] * cfg["head_dim"] * torch.bfloat16.itemsize
    per_token = per_layer * layers
    batch, prefix, own = 256, 4096, 64
    plain, cascade, two = batch * (prefix + own), prefix + batch * own, 2 * prefix + batch * own
    group = cfg["num_heads"] // cfg["num_kv_heads"]
    says("step06", 10, f"**{per_layer} bytes** per layer", f"**{per_token:,} bytes** over {layers} layers",
         f"{batch} × ({prefix:,} + {own}) = **{plain:,} tokens**", f"**{plain * per_token / 1e9:.1f} GB** per step",
         f"{prefix:,} + {batch} × {own} = **{cascade:,} tokens**", f"**{cascade * per_token / 1e9:.2f} GB**",
         f"**{plain // cascade}x** fewer", f"{batch} × {group} queries", f"**{batch * group} FLOP/byte**",
         f"decode's was `g` = {group}", "finds **0** common blocks", f"two groups of {batch // 2}",
         f"2 × {prefix:,} + {batch} × {own} = **{two:,} tokens**", f"**{two * per_token / 1e9:.2f} GB**")
    assert plain % cascade == 0 and prefix == 4096


def test_step06_q11_a_short_chunk_splits_its_prefix():
    from step06_triton.extend_attention import (
        FILL_PER_SM,
        LONG_CHUNK_TILE,
        MIN_SPLIT_LEN,
        SHORT_CHUNK_TILE,
        extend_splits,
    )

    heads, sms, new, prefix = SMOLLM2_135M["num_heads"], 132, 38, 2080
    block = SHORT_CHUNK_TILE[0]
    programs = -(-new // block) * heads
    splits = extend_splits(1, new, prefix, heads, block, sms)
    long_blocks = 8192 // LONG_CHUNK_TILE[0]
    says("step06", 11, f"1 block × {heads} heads × 1 sequence = **{programs} programs**",
         f"walking {prefix + new:,} keys", f"below {FILL_PER_SM} programs per SM (**{FILL_PER_SM * sms}**)",
         f"`min(⌈{FILL_PER_SM * sms} / {programs}⌉, ⌈{prefix:,} / {MIN_SPLIT_LEN}⌉, 16)` = **{splits} splits**",
         f"**{splits * programs} programs**",
         f"tiles of {LONG_CHUNK_TILE[0]} rows: {long_blocks} query blocks × {heads} heads = "
         f"**{long_blocks * heads} programs**")
    assert extend_splits(1, 8192, prefix, heads, LONG_CHUNK_TILE[0], sms) == 1


def test_step06_q12_fp8_bytes_and_rounding():
    from benchmarks.step06.fp8_accuracy import LLAMA_3_8B
    from step06_triton.fp8_pool import FP8_MAX, KVScales, dequantize, make_kv_pool, quantize, token_scales

    smollm2 = ModelConfig(**SMOLLM2_135M)
    sizes = {}
    for name, cfg in (("smollm2", smollm2), ("llama", LLAMA_3_8B)):
        pools = (dict(kv_cache_dtype="auto"), dict(kv_cache_dtype="fp8_e4m3"),
                 dict(kv_cache_dtype="fp8_e4m3", kv_scales=KVScales.uniform(cfg.num_layers)))
        sizes[name] = [make_kv_pool(cfg, PoolGeometry(1, 16), dtype=torch.bfloat16, device="meta", **p).bytes_per_block
                       for p in pools]
    bf16, fp8, static = sizes["smollm2"]
    scales = 2 * smollm2.num_layers * 16 * smollm2.num_kv_heads * 4
    per_gib = [2**30 // b for b in sizes["smollm2"]]
    says("step06", 12, f"**{bf16:,} bytes** in bf16", f"**{fp8:,} bytes** ({static:,} of e4m3 and {scales:,} of fp32",
         f"static scales **{static:,} bytes**", *(f"**{n:,}**" for n in per_gib),
         f"2,048 tokens takes {cdiv(2048, 16)} blocks",
         *(f"**{n * 16 // 2048}**" for n in per_gib), "**{:,}**, **{:,}** and **{:,} bytes**".format(*sizes["llama"]),
         "**{:,}**, **{:,}** and **{:,}** blocks per GiB".format(*(2**30 // b for b in sizes["llama"])),
         f"**{4 / smollm2.head_dim:.2%}**", f"**{4 / LLAMA_3_8B.head_dim:.3%}**")
    row = torch.zeros(1, 64)
    row[0, :4] = torch.tensor([10.0, 3.0, 0.01, -7.3])
    s = token_scales(row)
    back, scaled = dequantize(quantize(row, s), s, torch.float32)[0], (row / s[..., None])[0]
    stored = quantize(row, s).float()[0]
    assert s.item() == pytest.approx(10 / 448) and stored[0] == 448 and round(scaled[1].item(), 1) == 134.4
    lost = lambda i: abs(back[i].item() / row[0, i].item() - 1)  # noqa: E731
    low = 2.0 ** math.floor(math.log2(scaled[1].item()))  # the power of two below 3.0's scaled value
    says("step06", 12, "reads back as **10.0**", f"becomes {scaled[1]:.1f}", f"stored as {stored[1]:.0f}",
         f"**{back[1]:.3f}**, **{lost(1):.1%}**", f"becomes {scaled[2]:.3f}, stored as {stored[2]:.4f}",
         f"**{back[2]:.6f}** (**{lost(2):.1%}**", f"−7.3 becomes −{-scaled[3]:.2f}, stored as −{-stored[3]:.0f}",
         f"**−{-back[3]:.3f}** (**{lost(3):.1%}**)", f"({FP8_MAX / 2**8:g} · 2^8)", "1/16 of 2^k",
         f"between {low:g} and {2 * low:g} the e4m3 values are {low / 8:g} apart",
         f"over {FP8_MAX:g}, {row.abs().max():g}/{FP8_MAX:g}")
    assert FP8_MAX == torch.finfo(torch.float8_e4m3fn).max
    static_scale = torch.tensor([16 / 448])
    clipped = dequantize(quantize(torch.tensor([[24.0]]), static_scale), static_scale, torch.float32)
    from step06_triton import decode_attention
    rows, d = max(16, 32 // 8), 128  # decode's query rows (the GQA group padded to 16, decode_splits) at Llama's heads
    says("step06", 12, f"24 is {24 / static_scale.item():.0f} times", f"reads back as **{clipped.item():.0f}**",
         f"beyond {FP8_MAX:g}", "step 3 multiplies by the scales only in the product (`p * v_weight`",
         f"`VALUE_SCALE` ({decode_attention.VALUE_SCALE.value:,.0f}, a power of two",
         f"has s_j = 0.01 / {FP8_MAX:g}",
         f"values under {torch.finfo(torch.float16).tiny * 1e5:.0f} · 10^-5 lose bits",
         f"(for decode, {rows} rows against {d} head dims: an eighth)")
    assert rows / d == 1 / 8
    kernel = inspect.getsource(decode_attention.attend_tile.fn)  # step 3 of it is online_softmax
    step3 = inspect.getsource(decode_attention.online_softmax.fn)
    assert "(p * v_weight[None, :])" in step3 and "* VALUE_SCALE" in kernel, "the key describes step 3's weights"
    assert 0.01 / FP8_MAX * decode_attention.VALUE_SCALE.value > torch.finfo(torch.float16).tiny > 0.01 / FP8_MAX


def test_step06_q13_the_split_axes_of_a_decode_graph():
    from benchmarks.step06.kernels import GRAPH_CONTEXT
    from step06_triton.decode_attention import MIN_SPLIT_LEN, num_kv_splits, split_bucket, split_buckets

    kv, batch, context, longest = SMOLLM2_135M["num_kv_heads"], 64, 300, SMOLLM2_135M["max_position_embeddings"]
    buckets = split_buckets(longest)
    one_axis, axis = num_kv_splits(longest), split_bucket(buckets, context)
    ragged = next(r for r in step06_report.load()["kernels"]["decode"] if r["ragged"] and r["block_size"] == 16
                  and r["heads"] == "32/8x128")
    one_axis_tb_s = ragged["triton_graph_grid_tb_s"]  # the single axis for GRAPH_CONTEXT
    past = MIN_SPLIT_LEN + 1
    assert split_bucket(buckets, ragged["context"]) == ragged["max_splits"] == num_kv_splits(ragged["context"])
    says("step06", 13, f"`num_kv_splits({longest:,})` = **{one_axis} splits**",
         f"{kv} × {batch} × {one_axis} = **{kv * batch * one_axis:,} programs**", f"the batch's {batch} lengths",
         f"buckets for {longest:,} positions are {', '.join(map(str, buckets[:-1]))} and {buckets[-1]} splits",
         f"`num_kv_splits({context})` = **{num_kv_splits(context)}**",
         f"{kv} × {batch} × {axis} = **{kv * batch * axis} programs**", f"{SMOLLM2_135M['num_layers']} per",
         f"longest context, {ragged['context']:,} tokens, needs {num_kv_splits(ragged['context'])} splits",
         f"({ragged['triton_tb_s']}", f"moved {one_axis_tb_s:.2f}",
         f"with the {ragged['hq']} / {ragged['hkv']} heads, where one axis for "
         f"{GRAPH_CONTEXT // 1024}k contexts",
         f"a {past}-token context needs {num_kv_splits(past)} splits and replays the axis of "
         f"{split_bucket(buckets, past)}")


# ---------------------------------------------------------------- the audit: keep it last


# Numbers a key may state that no test computes and the question does not give: the constants of a formula or a
# position. Each entry says why; the audit fails on an entry the key no longer needs.
ALLOWED: dict[tuple[str, int], dict[str, str]] = {
    ("step01", 3): {"1": "O(1), a complexity"},
    ("step01", 5): {"0": "positions `0 … n`", "1": "the ± 1 of a position range"},
    ("step02", 4): {"1": "`ref_count` 1: the mark of a held block"},
    ("step03", 1): {"0": "block 0", "1": "block 1 and `h_{i−1}`"},
    ("step03", 3): {"0": "block 0 and a count of 0", "1": "block 1"},
    ("step03", 5): {"0": "block 0"},
    ("step04", 2): {"0": "a count of 0", "1": "a count ≥ 1, and count + 1"},
    ("step05", 1): {"0": "counting from 0 inside the edge, the wrong origin"},
    ("step05", 2): {"0": "the root's depth 0", "1": "the index j − 1 of a telescoping sum"},
    ("step05", 3): {"1": "`ref_count` 1: the new block's one holder"},
    ("step05", 5): {"1": "`ref_count` ≥ 1"},
    ("step05", 6): {"0": "a hit rate near 0: when to bypass, not a figure"},
    ("step06", 3): {"1": "exp(0) = 1, and a denominator grown by 1", "2": "base 2, the kernel's exp2"},
    ("step06", 12): {"4": "the bytes of one fp32 scale"},
}


@pytest.mark.usefixtures("whole_file_passed")
def test_every_number_in_the_keys_is_checked():
    """Every number in every key was checked by a `says` of this file for its question, is given by the
    question's README text, or is in `ALLOWED`: a number typed only in the markdown fails here."""
    unchecked, unused = [], []
    for key in sorted(KEYS.glob("*.md")):
        chapter = key.stem
        asked = question_texts(package(chapter))
        for n, text in sections(chapter).items():
            stated = numbers(CROSS_REFERENCE.sub("", text))
            allowed = ALLOWED.get((chapter, n), {})
            known = CHECKED[chapter, n] | numbers(asked.get(n, ""))
            unchecked += [f"{chapter} answer {n}: {x}" for x in sorted(stated - known - set(allowed))]
            unused += [f"{chapter} answer {n}: {x}" for x in sorted(set(allowed) - (stated - known))]
    assert not unchecked, ("numbers typed only in the keys: check each with `says` (computed from the code or read "
                           "from the committed results), or list it in ALLOWED with its reason:\n"
                           + "\n".join(unchecked))
    assert not unused, "ALLOWED entries the keys no longer need (remove them):\n" + "\n".join(unused)
