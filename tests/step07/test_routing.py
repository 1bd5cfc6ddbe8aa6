"""The routing policies on their own: what a replica is said to hold (its events, plus the prompts it is running),
the walk along a prompt's chain, the load bound, and turns. CacheAware's tests count a replica's match with the
stand-in below (`known_prefix`), so task7.route is graded alone; one of them also runs as written, with the
student's `matched_blocks`, and carries both tasks' markers."""
from __future__ import annotations

import pytest

from step03_prefix_hash import hash_token_blocks
from step07_serving import routing
from step07_serving.kv_events import BlockRemoved, BlockStored, wire_hash
from step07_serving.routing import CacheAware, ReplicaState, RoundRobin, matched_blocks

BS = 4


def chain(tokens: list[int]) -> list[int]:
    return [wire_hash(h) for h in hash_token_blocks(tokens, BS)]


def holding(*prompts: list[int], in_flight: int = 0) -> ReplicaState:
    """A replica whose events stored these prompts' full blocks."""
    replica = ReplicaState("http://replica")
    for tokens in prompts:
        hashes = chain(tokens)
        replica.view.apply(BlockStored(hashes, None, tokens[:len(hashes) * BS], BS))
    replica.in_flight = in_flight
    return replica


SYSTEM_A, SYSTEM_B = list(range(100, 116)), list(range(200, 216))  # four blocks each


def known_prefix(replica: ReplicaState, block_hashes: list[int]) -> int:
    """A stand-in for `matched_blocks` (task7.match): the index of the first block the replica does not know."""
    return next((i for i, h in enumerate(block_hashes) if not replica.knows(h)), len(block_hashes))


@pytest.fixture
def match_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """CacheAware counts matches with the stand-in: its tests run no body of task7.match."""
    monkeypatch.setattr(routing, "matched_blocks", known_prefix)


ROUTE_ALONE = [pytest.mark.task("task7.route"), pytest.mark.usefixtures("match_stand_in")]


def route_alone(test):
    for mark in ROUTE_ALONE:
        test = mark(test)
    return test


@pytest.mark.task("task7.match")
def test_a_match_walks_the_chain_and_stops_at_the_first_unknown_block():
    replica = holding(SYSTEM_A + [1, 2, 3, 4])
    assert matched_blocks(replica, chain(SYSTEM_A + [1, 2, 3, 4, 5, 6, 7, 8])) == 5
    assert matched_blocks(replica, chain(SYSTEM_A[:8] + [9, 9, 9, 9] + SYSTEM_A[12:])) == 2
    assert matched_blocks(replica, chain(SYSTEM_B)) == 0
    assert matched_blocks(replica, []) == 0


@pytest.mark.task("task7.match")
def test_a_match_knows_what_was_evicted_and_what_is_running():
    replica = holding(SYSTEM_A)
    replica.view.apply(BlockRemoved(chain(SYSTEM_A)[2:]))
    assert matched_blocks(replica, chain(SYSTEM_A)) == 2
    replica.start(chain(SYSTEM_B))  # sent there, its events not in yet
    assert matched_blocks(replica, chain(SYSTEM_B + [1, 2, 3, 4])) == 4
    replica.start(chain(SYSTEM_B))
    replica.finish(chain(SYSTEM_B))
    assert matched_blocks(replica, chain(SYSTEM_B)) == 4  # one of the two still runs
    replica.finish(chain(SYSTEM_B))
    assert matched_blocks(replica, chain(SYSTEM_B)) == 0 and not replica.running and replica.in_flight == 0


@pytest.mark.parametrize("alone", [pytest.param(True, marks=pytest.mark.task("task7.route"), id="stand-in-match"),
                                   pytest.param(False, marks=[pytest.mark.task("task7.route"),
                                                              pytest.mark.task("task7.match")], id="as-written")])
def test_cache_aware_sends_a_prompt_where_its_longest_prefix_is(alone, monkeypatch):
    if alone:
        monkeypatch.setattr(routing, "matched_blocks", known_prefix)
    replicas = [holding(SYSTEM_B), holding(SYSTEM_A[:8]), holding(SYSTEM_A)]
    assert CacheAware().choose(replicas, chain(SYSTEM_A + [7, 7, 7, 7])) == 2
    assert CacheAware().choose(replicas, chain(SYSTEM_B[:8] + [7, 7, 7, 7])) == 0


@route_alone
def test_the_load_bound_overrides_the_cache():
    replicas = [holding(SYSTEM_A, in_flight=6), holding(in_flight=1)]
    assert CacheAware(max_imbalance=4).choose(replicas, chain(SYSTEM_A)) == 1
    assert CacheAware(max_imbalance=5).choose(replicas, chain(SYSTEM_A)) == 0


@route_alone
def test_without_a_match_new_prefixes_go_to_the_least_loaded_then_in_turn():
    policy = CacheAware()
    replicas = [holding(in_flight=2), holding(in_flight=1), holding(in_flight=1)]
    assert policy.choose(replicas, chain(SYSTEM_A)) == 1
    assert policy.choose(replicas, chain(SYSTEM_B)) == 2  # a tie: the next one after the last choice
    assert policy.choose(replicas, chain([5] * 8)) == 1


@route_alone
def test_a_replica_that_is_down_gets_nothing():
    replicas = [holding(SYSTEM_A), holding()]
    replicas[0].healthy = False
    assert CacheAware().choose(replicas, chain(SYSTEM_A)) == 1
    assert [RoundRobin().choose(replicas, []) for _ in range(1)] == [1]
    replicas[1].healthy = False
    for policy in (CacheAware(), RoundRobin()):
        with pytest.raises(LookupError):
            policy.choose(replicas, chain(SYSTEM_A))


def test_round_robin_takes_turns_whatever_is_cached():
    policy, replicas = RoundRobin(), [holding(SYSTEM_A), holding(), holding()]
    assert [policy.choose(replicas, chain(SYSTEM_A)) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
