"""Cache-aware scheduling (policy.py): the order it gives, the preempted head it keeps, the fallback to arrival
order on a long queue, the bound on overtaking, dfs-weight's walk of the tree; through the engine, answers
identical to step01's under every policy on both designs of chapters 3-4, under memory pressure; and the
pictures of the queue.

lpm's tests look prompts up in a radix manager whose tree is the stand-in's (stand_in.py), so task4.lpm needs no
other task of the chapter: it is graded alone."""
from __future__ import annotations

import re
from collections import deque

import pytest

from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.tiny import tiny_model
from step02_paged import FCFS, Engine, EngineConfig
from step02_paged.geometry import PoolGeometry
from step03_prefix_hash import PrefixCachingKVCacheManager
from step04_radix import RadixKVCacheManager
from step04_radix.pictures import lpm_figures, queue_text
from step04_radix.policy import FCFS_ABOVE, DFSWeight, LongestPrefixMatch, make_policy
from tests.driver import drive_to_end, most_overtaken, shared_prompts, with_reference
from tests.step04.stand_in import StandInTree

PARAMS = SamplingParams(max_new_tokens=2)
STEM = list(range(1, 21))  # 20 cached tokens


class StandInRadix(RadixKVCacheManager):
    """The radix manager over the stand-in's tree (no homework body of the tree runs)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.tree = StandInTree()


def cached(*prompts: list[int]) -> RadixKVCacheManager:
    """A slot tree holding `prompts`, nobody running."""
    kv = StandInRadix(PoolGeometry(256, 1))
    for p in prompts:
        slots = kv.block_manager.allocate(len(p))
        kv.block_manager.release(slots[: kv.tree.insert(p, slots)])  # the tree had those tokens already
    kv.check_invariants()
    return kv


def queue(kv, *prompts: list[int]) -> deque:
    return deque(kv.new_sequence(i, list(p), PARAMS) for i, p in enumerate(prompts))


def ids(waiting) -> list[int]:
    return [s.seq_id for s in waiting]


@pytest.mark.task("task4.lpm")
def test_lpm_puts_the_longest_cached_prefix_first():
    kv = cached(STEM)
    waiting = queue(kv, [50, 51, 52], STEM[:5] + [99], STEM + [7], STEM[:5] + [98, 97], STEM[:12] + [3])
    before = [list(s.all_token_ids) for s in waiting]
    LongestPrefixMatch().order(waiting, kv, 2)
    assert ids(waiting) == [2, 4, 1, 3, 0], "20, 12, 5, 5 (in arrival order), 0 cached tokens"
    assert sorted([list(s.all_token_ids) for s in waiting]) == sorted(before), "ordering changes no request"
    assert all(s.num_computed_tokens == 0 and not s.block_table for s in waiting)
    kv.check_invariants()  # the lookups split edges and touched clocks, and held nothing


@pytest.mark.task("task4.lpm")
def test_preempted_requests_stay_at_the_front():
    kv = cached(STEM)
    waiting = queue(kv, [60, 61], [62, 63], STEM[:3] + [5], STEM + [8])
    waiting[0].num_preemptions = waiting[1].num_preemptions = 1  # requeued at the front by a preemption
    LongestPrefixMatch().order(waiting, kv, 1)
    assert ids(waiting) == [0, 1, 3, 2]


@pytest.mark.task("task4.lpm")
def test_a_queue_longer_than_fcfs_above_goes_in_arrival_order_without_lookups(monkeypatch):
    kv = cached(STEM)
    prompts = [[70 + i] for i in range(4)] + [STEM + [i] for i in range(4)]
    lookups = []
    lookup = kv.get_computed_blocks
    monkeypatch.setattr(kv, "get_computed_blocks", lambda seq: lookups.append(seq.seq_id) or lookup(seq))
    policy = LongestPrefixMatch(fcfs_above=7)
    waiting = queue(kv, *prompts)
    waiting.rotate(3)  # an earlier order left it shuffled
    policy.order(waiting, kv, 2)
    assert ids(waiting) == list(range(8)) and not lookups and policy.num_fcfs_fallbacks == 1
    waiting.pop()  # 7 waiting: not above the threshold, so ranked by cached prefix
    policy.order(waiting, kv, 2)
    assert ids(waiting) == [4, 5, 6, 0, 1, 2, 3] and len(lookups) == 7 and policy.num_fcfs_fallbacks == 1
    assert FCFS_ABOVE == LongestPrefixMatch().fcfs_above == 128, "SGLang's threshold"


@pytest.mark.task("task4.lpm")
def test_the_bound_moves_a_due_request_and_everyone_older_to_the_front():
    """Request 0 has no cached prefix; 1 and 2 arrived after it and have one. With one seat, lpm would admit 1
    first, overtaking 0 once: fine while 0 was overtaken fewer than `max_overtakes` times, else 0 goes first.
    With two seats, 1 and 2 may both be admitted now: 0 goes first if two more overtakes would pass the bound."""
    kv = cached(STEM)
    for seats, already, bound, expected in ((1, 0, 1, [1, 2, 0]), (1, 1, 1, [0, 1, 2]), (2, 0, 2, [1, 2, 0]),
                                            (2, 0, 1, [0, 1, 2]), (2, 1, 2, [0, 1, 2]), (2, 5, None, [1, 2, 0])):
        waiting = queue(kv, [90], STEM + [1], STEM + [2])
        policy = LongestPrefixMatch(max_overtakes=bound)
        policy.overtaken = {waiting[0]: already}
        policy.order(waiting, kv, seats)
        assert ids(waiting) == expected, (seats, already, bound)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5)


@pytest.mark.task("task4.lpm")
@pytest.mark.parametrize("bound", [None, 0, 3])
def test_a_request_lpm_passes_over_is_admitted_within_its_bound(model, bound):
    """One seat; a request with nothing cached arrives, then a new request behind a cached stem arrives every
    step. lpm alone admits every stem request first, for as long as they come; with a bound of k, the lonely
    request is admitted right after the k-th overtake."""
    engine = Engine(model, EngineConfig(num_blocks=4096, block_size=1, max_num_seqs=1), StandInRadix,
                    policy=LongestPrefixMatch(max_overtakes=bound))
    stem = list(range(100, 130))
    drive_to_end(engine, [stem + [1]], PARAMS)  # the stem is cached
    lonely = engine.add_request(list(range(200, 215)), PARAMS)
    outs = {}
    for i in range(12):
        engine.add_request(stem + [2 + i], PARAMS)
        outs.update((o.seq_id, o) for o in engine.step())
    outs.update((o.seq_id, o) for o in drive_to_end(engine))
    order = [seq_id for seq_id, _, _ in engine.cache_manager.stats.recent]
    overtakes = sum(later > lonely for later in order[: order.index(lonely)])
    assert overtakes == (12 if bound is None else bound), order
    assert outs[lonely].output_ids == generate(model, list(range(200, 215)), PARAMS)
    assert most_overtaken(engine) == overtakes


DESIGNS = {"hash": (PrefixCachingKVCacheManager, 4), "radix": (StandInRadix, 1)}


@pytest.mark.parametrize("design,policy", [
    pytest.param(d, p, marks=[pytest.mark.task("task4.lpm")] if p.startswith("lpm") else [], id=f"{d}-{p}")
    for d in DESIGNS for p in ("fcfs", "lpm", "lpm-bounded", "dfs-weight")
    if d != "hash" or p != "dfs-weight"])  # dfs-weight walks a tree
def test_no_policy_changes_any_answer_under_memory_pressure(model, design, policy):
    """Shared-prefix prompts, all queued at once, on a pool that must evict: every answer is step01's, twice,
    whatever the order of admission."""
    prompts, params, expected = with_reference(model, shared_prompts(10, seed=4), new_tokens=6)
    manager, block_size = DESIGNS[design]
    chosen = make_policy("lpm", max_overtakes=1) if policy == "lpm-bounded" else make_policy(policy)
    engine = Engine(model, EngineConfig(num_blocks=120 // block_size, block_size=block_size, max_num_seqs=3,
                                        max_num_batched_tokens=32), manager, policy=chosen)
    for round_ in range(2):
        outs = drive_to_end(engine, prompts, params)
        assert [o.output_ids for o in outs] == expected, f"round {round_}"
    kv = engine.cache_manager
    assert sum(o.num_cached_tokens for o in outs) > 0
    assert getattr(kv, "num_evicted", 0) + getattr(kv.block_manager, "num_evicted", 0) > 0, "meant to evict"
    assert most_overtaken(engine) <= {"fcfs": 0, "lpm-bounded": 1}.get(policy, len(prompts))
    if policy == "lpm":
        assert most_overtaken(engine) > 0, "lpm was meant to reorder this queue"


def test_dfs_weight_walks_the_heaviest_subtree_first():
    """Two cached branches below a shared stem: branch a (4 tokens deeper) has 2 waiting requests, branch b 3.
    lpm takes a's first (longer matches); dfs-weight takes b's (the heavier subtree), then a's, then the request
    that ends at the stem, then the one that matches nothing."""
    a, b = STEM[:8] + [30, 31, 32, 33], STEM[:8] + [40, 41]
    kv = cached(a, b)
    prompts = [[77, 78], a + [90], b + [91], a + [92], b + [93], STEM[:8] + [55], b + [94]]
    waiting = queue(kv, *prompts)
    DFSWeight().order(waiting, kv, 2)
    assert ids(waiting) == [2, 4, 6, 1, 3, 5, 0]
    waiting = queue(kv, *prompts)
    LongestPrefixMatch().order(waiting, kv, 2)
    assert ids(waiting) == [1, 3, 2, 4, 6, 5, 0]


def test_dfs_weight_needs_a_tree(model):
    """Said once, by the policy, when an engine's scheduler is given it: not at the first busy step."""
    with pytest.raises(ValueError, match="radix tree"):
        Engine(model, EngineConfig(num_blocks=8, block_size=4), PrefixCachingKVCacheManager, policy=DFSWeight())
    Engine(model, EngineConfig(num_blocks=8, block_size=1), RadixKVCacheManager, policy=DFSWeight())


def test_policies_by_name_and_bad_options():
    assert isinstance(make_policy("fcfs"), FCFS)
    assert isinstance(make_policy("lpm", max_overtakes=3), LongestPrefixMatch)
    assert make_policy("dfs-weight").name == "dfs-weight"
    with pytest.raises(ValueError, match="lpm"):
        make_policy("longest")
    with pytest.raises(ValueError, match="no options"):
        make_policy("fcfs", max_overtakes=2)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_overtakes"):
            LongestPrefixMatch(max_overtakes=bad)
    with pytest.raises(ValueError, match="fcfs_above"):
        LongestPrefixMatch(fcfs_above=-1)


def test_the_queue_is_drawn_before_and_after_lpm():
    """The lesson's figures: the same four requests, in arrival order and then in lpm's, each pointing at the node
    where its cached prefix ends (DOT text: no graphviz needed)."""
    figures = lpm_figures()
    before, after = figures["lpm_before"], figures["lpm_after"]
    assert re.findall(r"\d\. seq (\d)", before) == ["1", "2", "3", "4"]
    assert re.findall(r"\d\. seq (\d)", after) == ["3", "2", "4", "1"]
    assert re.findall(r"seq \d: (\d+) of", after) == ["16", "11", "5", "1"]
    for dot in (before, after):
        targets = re.findall(r'"queue":q\d -> "(n\d+)"', dot)
        assert len(targets) == 4 and all(f'"{t}" [label=' in dot for t in targets)
    kv = cached(STEM)
    waiting = queue(kv, [5], STEM + [9])
    assert queue_text(kv, waiting).splitlines()[1].startswith("  2. seq 1:   20 of   21 prompt tokens cached")
