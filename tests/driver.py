"""Drive an engine to completion, checking every invariant after every step (shared by the chapters' tests)."""
from __future__ import annotations

import random

from step01_kvcache.generate import SamplingParams, generate


def drive_checked(engine, prompts, params) -> list:
    """Add all prompts, step until drained with `check_invariants()` after each step; outputs in prompt order."""
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            done[out.seq_id] = out
        engine.check_invariants()
    return [done[i] for i in ids]


def check_drained(engine) -> None:
    """After the drain every block is free, or (chapters 4 and 5) cached by the tree with no lock left."""
    tree = getattr(engine, "tree", None)
    if tree is None:
        assert engine.kv.block_manager.num_free == engine.config.num_blocks, "a drained engine leaked blocks"
        return
    assert tree.protected_size == 0 and all(n.lock_ref == 0 for n in tree.nodes()), "a lock outlived its request"
    assert engine.kv.block_manager.num_free + len(tree.all_slots()) == engine.config.num_blocks, "leaked blocks"


def run_drained(engine, prompts, params) -> list:
    """`drive_checked`, then `check_drained`."""
    outs = drive_checked(engine, prompts, params)
    check_drained(engine)
    return outs


def shared_prompts(n: int, seed: int, stem: int = 60) -> list[list[int]]:
    """Prompts that share random-length prefixes of one stem (on and off block boundaries), then diverge."""
    rng = random.Random(seed)
    base = [rng.randrange(256) for _ in range(stem)]
    return [base[: rng.randint(0, stem)] + [rng.randrange(256) for _ in range(rng.randint(1, 25))] for _ in range(n)]


def with_reference(model, prompts: list[list[int]], new_tokens: int):
    """(prompts, params, step01's greedy answers): what every engine must reproduce token for token."""
    params = SamplingParams(max_new_tokens=new_tokens)
    return prompts, params, [generate(model, p, params) for p in prompts]


def drive_to_end(engine) -> dict:
    """Step until drained, `check_invariants()` after each step; the finished outputs by seq_id."""
    outs = {}
    while engine.has_unfinished():
        outs.update((o.seq_id, o) for o in engine.step())
        engine.check_invariants()
    return outs


def peak_blocks_off_and_on(make_engine, prompts, params) -> dict[bool, int]:
    """Peak blocks held while `prompts` run together, cache off and on, after one of them warmed the cache."""
    peaks = {}
    for on in (False, True):
        engine = make_engine(on)
        run_drained(engine, prompts[:1], params)
        engine.stats.peak_blocks = 0
        run_drained(engine, prompts, params)
        peaks[on] = engine.stats.peak_blocks
    return peaks


def run_twice_under_pressure(engine, reference) -> list:
    """Two rounds of the reference prompts on a small pool: answers must equal step01's both times."""
    prompts, params, expected = reference
    for _ in range(2):
        outs = run_drained(engine, prompts, params)
        assert [o.output_ids for o in outs] == expected
    assert engine.kv.num_evicted > 0, "the pool was meant to be too small to keep everything cached"
    return outs


def demo_answer_matches_step01(chapter_main, capsys, new_tokens: int = 12) -> None:
    """`python -m stepNN --answer-only` prints exactly what chapter 1's demo prints."""
    from step01_kvcache.__main__ import main as step01_main

    argv = ["--answer-only", "--max-new-tokens", str(new_tokens)]
    assert step01_main(argv) == 0
    theirs = capsys.readouterr().out
    assert chapter_main(argv) == 0
    assert capsys.readouterr().out == theirs and theirs.strip()
