"""Drive an engine to completion, checking every invariant after every step (shared by the chapters' tests)."""
from __future__ import annotations

import random

from step01_kvcache.generate import SamplingParams, generate


def drive_to_end(engine, prompts=(), params: SamplingParams | list[SamplingParams] = SamplingParams(),
                 **options) -> list:
    """Add `prompts` (each with `options`, e.g. a cache salt), then step until the engine is drained, with
    `check_invariants()` after every step — the engine's own check says what a drained engine may still hold.
    Returns every output that finished on the way, in seq_id order (so the new prompts' outputs, in their
    order, when the engine started drained)."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    for p, sp in zip(prompts, plist, strict=True):
        engine.add_request(p, sp, **options)
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            done[out.seq_id] = out
        engine.check_invariants()
    engine.check_invariants()
    return [done[i] for i in sorted(done)]


def most_overtaken(engine) -> int:
    """From the first admissions the cache manager recorded, in order: the most requests that arrived after some
    request (ids are handed out in arrival order) and were admitted before it. 0 under first come, first served."""
    order = [seq_id for seq_id, _, _ in engine.cache_manager.stats.recent]
    return max((sum(later > seq_id for later in order[:i]) for i, seq_id in enumerate(order)), default=0)


def shared_prompts(n: int, seed: int, stem: int = 60) -> list[list[int]]:
    """Prompts that share random-length prefixes of one stem (on and off block boundaries), then diverge."""
    rng = random.Random(seed)
    base = [rng.randrange(256) for _ in range(stem)]
    return [base[: rng.randint(0, stem)] + [rng.randrange(256) for _ in range(rng.randint(1, 25))] for _ in range(n)]


def with_reference(model, prompts: list[list[int]], new_tokens: int):
    """(prompts, params, step01's greedy answers): what every engine must reproduce token for token."""
    params = SamplingParams(max_new_tokens=new_tokens)
    return prompts, params, [generate(model, p, params) for p in prompts]


def peak_blocks_off_and_on(make_engine, prompts, params) -> dict[bool, int]:
    """Peak blocks held while `prompts` run together, cache off and on, after one of them warmed the cache."""
    peaks = {}
    for on in (False, True):
        engine = make_engine(on)
        drive_to_end(engine, prompts[:1], params)
        engine.stats.peak_blocks = 0
        drive_to_end(engine, prompts, params)
        peaks[on] = engine.stats.peak_blocks
    return peaks


def run_twice_under_pressure(engine, reference) -> list:
    """Two rounds of the reference prompts on a small pool: answers must equal step01's both times."""
    prompts, params, expected = reference
    for _ in range(2):
        outs = drive_to_end(engine, prompts, params)
        assert [o.output_ids for o in outs] == expected
    assert engine.cache_manager.num_evicted > 0, "the pool was meant to be too small to keep everything cached"
    return outs


def demo_answer_matches_step01(chapter_main, capsys, new_tokens: int = 12) -> None:
    """`python -m stepNN --answer-only` prints exactly what chapter 1's demo prints."""
    from step01_kvcache.__main__ import main as step01_main

    argv = ["--answer-only", "--max-new-tokens", str(new_tokens)]
    assert step01_main(argv) == 0
    theirs = capsys.readouterr().out
    assert chapter_main(argv) == 0
    assert capsys.readouterr().out == theirs and theirs.strip()
