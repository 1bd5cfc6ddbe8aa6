"""Drive an engine to completion, checking every invariant after every step (shared by the chapters' tests)."""
from __future__ import annotations

import functools
import random

from step01_kvcache.generate import SamplingParams, generate


def engine_for(model, config, *args, num_speculative_tokens: int = 0, **kwargs):
    """Chapter 2's engine, or chapter 5's SpeculativeEngine verifying `num_speculative_tokens` guesses a step."""
    from step02_paged import Engine
    from step05_bridge import SpeculativeConfig, SpeculativeEngine

    if not num_speculative_tokens:
        return Engine(model, config, *args, **kwargs)
    return SpeculativeEngine(model, config, *args, speculative=SpeculativeConfig(num_speculative_tokens), **kwargs)


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


def oracle(model):
    """step01's greedy answer to `(prompt as a tuple, max_new_tokens)`, cached: what every engine must give."""
    @functools.cache
    def answer(prompt: tuple[int, ...], new: int) -> list[int]:
        return generate(model, list(prompt), SamplingParams(max_new_tokens=new))
    return answer


class ScriptedProposer:
    """A proposer for the tests whose drafts have a known fate: the next `good` tokens of the sequence's greedy
    answer (`answer(prompt, max_new_tokens)`, e.g. step01's `generate`), then `bad` tokens that are not (each a
    different token from the answer's there). Only a greedy run accepts exactly the good ones; a sampled run
    accepts whatever its samples agree with. `good` and `bad` may be changed between steps."""

    def __init__(self, answer, vocab_size: int, good: int = 2, bad: int = 1) -> None:
        self.answer, self.vocab_size, self.good, self.bad = answer, vocab_size, good, bad
        self.seen: set[int] = set()

    def propose(self, seq, max_tokens: int) -> list[int]:
        self.seen.add(seq.seq_id)
        truth = self.answer(tuple(seq.prompt_ids), seq.params.max_new_tokens)
        done = len(seq.output_ids)
        drafts = list(truth[done: done + self.good])
        start = done + len(drafts)
        drafts += [((truth[i] if i < len(truth) else 0) + 1) % self.vocab_size for i in range(start, start + self.bad)]
        return drafts[:max(max_tokens, 0)]

    def drop(self, seq_id: int) -> None:
        self.seen.discard(seq_id)

    def tracked(self) -> set[int]:
        return set(self.seen)


def speculative_engine(engine, answer, good: int = 2, bad: int = 1):
    """`engine` (a SpeculativeEngine) with a ScriptedProposer instead of prompt lookup."""
    engine.proposer = ScriptedProposer(answer, engine.model.config.vocab_size, good, bad)
    return engine



def assert_caches_only_verified_tokens(kv, verified: list[list[int]]) -> None:
    """Everything a prefix cache can serve names tokens some request verified (its prompt and its answer), never
    a draft: chapter 3's published blocks hash a block of one of `verified`, chapters 4-5's tree paths are
    prefixes of one of them."""
    if hasattr(kv, "tree"):
        for node in kv.tree.nodes():
            path = kv.tree.prefix_tokens(node)
            assert any(v[: len(path)] == path for v in verified), f"the tree caches unverified tokens {path}"
        return
    from step03_prefix_hash.block_hash import hash_token_blocks

    known = {h for v in verified for h in hash_token_blocks(v, kv.block_size)}
    for b, entry in enumerate(kv.block_manager.entries):
        assert entry is None or entry.block_hash in known, f"block {b} is published with unverified tokens"


def speculation_reuses_only_verified(engine, answer, prompts: list[list[int]], new_tokens: int,
                                     roomy: bool = True) -> None:
    """A prefix cache under speculative decoding: `engine` (a SpeculativeEngine) answers `prompts` with drafts
    that are mostly wrong (rollbacks everywhere, across block boundaries too), equal to `answer`'s; what the cache
    then holds names verified tokens only; and requests that continue those answers reuse what the first ones
    computed, decode blocks included (when the pool is `roomy` enough to keep them), and still get `answer`'s
    tokens (a rejected draft's K/V published under a verified token would change them)."""
    speculative_engine(engine, answer, good=1, bad=3)
    params = SamplingParams(max_new_tokens=new_tokens)
    outs = drive_to_end(engine, prompts, params)
    assert [o.output_ids for o in outs] == [answer(tuple(p), new_tokens) for p in prompts]
    assert engine.stats.draft_tokens > engine.stats.accepted_tokens > 0
    verified = [p + o.output_ids for p, o in zip(prompts, outs)]
    assert_caches_only_verified_tokens(engine.cache_manager, verified)
    again = [v[:-1] for v in verified]  # the last answer token was never computed: all the rest may hit
    outs = drive_to_end(engine, again, params)
    assert [o.output_ids for o in outs] == [answer(tuple(p), new_tokens) for p in again]
    hits = sum(o.num_cached_tokens for o in outs)
    assert hits > (sum(map(len, prompts)) if roomy else 0), "the answers' blocks were meant to hit"
