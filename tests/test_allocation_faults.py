"""A block allocation that raises, at every allocation of a run, for every cache design: the step raises that error
and changes nothing, the request it was allocating for can be aborted or left to retry, every other request still
gets step01's tokens, and a drained engine returns every block.

Every cache manager promises all or nothing (`allocate_slots`): a request is registered as a holder, locks a tree
node or takes references on shared blocks only once its blocks are allocated. A fault in the middle is what tests
that promise: the faulty run must be indistinguishable from one where the failed admission never started.
"""
from __future__ import annotations

import functools

import pytest

from step01_kvcache.generate import SamplingParams
from step02_paged import Engine, EngineConfig
from step05_bridge import BridgeKVCacheManager
from step06_triton.engine import PREFIX_CACHES
from step06_triton.overlap import OverlapEngine
from tests.driver import oracle, shared_prompts
from tests.machines import MODEL

NEW_TOKENS = 5
PROMPTS = shared_prompts(5, seed=4, stem=20)
expected = oracle(MODEL)


class AllocationFault(RuntimeError):
    """Raised in place of one BlockManager.allocate."""


DESIGNS = {
    "none": (PREFIX_CACHES["none"], 4),
    "hash": (PREFIX_CACHES["hash"], 4),
    "radix": (PREFIX_CACHES["radix"], 1),
    "bridge": (PREFIX_CACHES["bridge"], 4),
    "bridge+host": (functools.partial(BridgeKVCacheManager, host_blocks=6, min_load_tokens=4), 4),
}


def build(design: str, overlap: bool = False) -> Engine:
    """A pool of 64 slots: the five requests do not all fit at once, so evictions and preemptions happen."""
    manager, block = DESIGNS[design]
    config = EngineConfig(num_blocks=64 // block, block_size=block, max_num_seqs=3, max_num_batched_tokens=16)
    return (OverlapEngine if overlap else Engine)(MODEL, config, manager)


def instrument(engine: Engine, fail_at: int | None) -> dict:
    """Count the pool's allocations (raising AllocationFault at call number `fail_at`) and remember which request
    the cache manager was allocating for when it did."""
    state = {"calls": 0, "seq": None}
    bm, kv = engine.cache_manager.block_manager, engine.cache_manager
    allocate, allocate_slots = bm.allocate, kv.allocate_slots

    def faulty_allocate(n):
        state["calls"] += 1
        if state["calls"] - 1 == fail_at:
            raise AllocationFault(f"injected at allocation {fail_at}")
        return allocate(n)

    def tracked_allocate_slots(seq, *args, **kwargs):
        state["seq"] = seq.seq_id
        return allocate_slots(seq, *args, **kwargs)

    bm.allocate, kv.allocate_slots = faulty_allocate, tracked_allocate_slots
    return state


def run(design: str, overlap: bool, fail_at: int | None, abort_faulted: bool) -> tuple[int, set[int]]:
    """The prompts through a fresh engine, with one allocation failing; returns (allocations made, ids aborted)."""
    engine = build(design, overlap)
    state = instrument(engine, fail_at)
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    ids = [engine.add_request(p, params) for p in PROMPTS]
    done, aborted, faults = {}, set(), 0
    while engine.has_unfinished():
        try:
            outs = engine.step()
        except AllocationFault:
            faults += 1
            engine.check_invariants()  # the failed step changed nothing the invariants can see
            if abort_faulted:
                out = engine.abort(state["seq"])
                assert out.aborted
                aborted.add(out.seq_id)
                engine.check_invariants()
            continue
        for out in outs:
            done[out.seq_id] = out
        engine.check_invariants()
    assert faults == (fail_at is not None), f"the fault at allocation {fail_at} was raised {faults} times"
    for sid, prompt in zip(ids, PROMPTS):
        if sid not in aborted:
            assert done[sid].output_ids == expected(tuple(prompt), NEW_TOKENS), f"request {sid} changed its answer"
    kv = engine.cache_manager
    assert not kv.holders and kv.slot_usage() == (0, 0), "a drained engine still holds memory"
    kv.reset_cache()
    kv.check_invariants()
    assert kv.block_manager.num_free == kv.num_blocks, "a drained engine, its cache reset, did not free every block"
    return state["calls"], aborted


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_a_fault_at_every_allocation_changes_nothing(design, overlap):
    calls, _ = run(design, overlap, None, False)
    assert calls > 5, "the run was meant to allocate many times"
    for k in range(calls):
        for abort_faulted in (True, False):
            try:
                run(design, overlap, k, abort_faulted)
            except AssertionError as e:
                raise AssertionError(f"{design}, fault at allocation {k} of {calls}, "
                                     f"{'aborted' if abort_faulted else 'retried'}: {e}") from e


def test_the_fault_reaches_the_caller_unchanged():
    """The error a step raises is the allocator's own, not one the engine made up on the way."""
    engine = build("radix")
    instrument(engine, 0)
    engine.add_request(PROMPTS[0], SamplingParams(max_new_tokens=2))
    with pytest.raises(AllocationFault, match="injected at allocation 0"):
        engine.step()
