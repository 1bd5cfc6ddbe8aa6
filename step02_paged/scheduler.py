"""Continuous batching: every step, decide which sequences run and how many tokens each.

A step has a token budget (`max_num_batched_tokens`) and a seat limit (`max_num_seqs`). Running
sequences go first, in arrival order: a decode needs 1 token, an unfinished prefill takes what the
budget allows (chunked prefill, so a long prompt never stalls the decodes). When the pool is out of
blocks, the most recently admitted running sequence is preempted: its blocks are released and it goes
back to the front of the queue, to be recomputed later. Then waiting sequences are admitted from the front
of the queue while budget, seats and blocks last; a new one starts after the prefix its cache manager found
(`Sequence.admit`). Nothing is ever half-allocated, so nothing leaks.

Which waiting sequence comes first is a policy's choice: before admitting, the scheduler lets its policy order
the queue. This chapter's is first come, first served (FCFS), which leaves it as it is.
"""
from __future__ import annotations

from collections import deque

from .cache_manager import CacheManager, PrefixMatch
from .config import EngineConfig
from .sequence import Sequence


def admit(cache_manager: CacheManager, seq: Sequence, match: PrefixMatch) -> None:
    """An admitted sequence starts after the prefix its match covers; its prompt hit is counted once per request
    (a recompute after a preemption finds its own blocks, which is no hit)."""
    first = not seq.num_preemptions
    seq.admit(match.num_tokens)
    if first:
        cache_manager.stats.record(seq)


class Policy:
    """Orders the waiting queue before admission. It may keep state (one policy per scheduler) and may ask the
    cache manager about a request (`get_computed_blocks` looks only); it never changes a request. The scheduler
    asks once whether it can work with the cache manager (`check`) and tells it every admission (`on_admit`).
    A policy subclasses this one and writes `order`; the other two do nothing unless it needs them."""

    name = "policy"

    def order(self, waiting: deque[Sequence], cache_manager: CacheManager, seats: int) -> None:
        """Reorder `waiting` in place; preempted sequences stay at its front, in their order. At most `seats`
        sequences (the free seats) are admitted from the front before the next call."""
        raise NotImplementedError

    def on_admit(self, seq: Sequence) -> None:
        """`seq` was just admitted (for the first time, or again after a preemption)."""

    def check(self, cache_manager: CacheManager) -> None:
        """Raise ValueError if this policy cannot order the queue of this cache manager."""


class FCFS(Policy):
    """First come, first served: the queue as it is, in arrival order, a preempted sequence at its front."""

    name = "fcfs"

    def order(self, waiting: deque[Sequence], cache_manager: CacheManager, seats: int) -> None:
        """Nothing to reorder."""


class Scheduler:
    """Reads the budget fields of the engine's config; asks the cache manager for memory and the policy for the
    admission order."""

    def __init__(self, config: EngineConfig, cache_manager: CacheManager, policy: Policy | None = None) -> None:
        self.config, self.cache_manager = config, cache_manager
        self.policy: Policy = policy or FCFS()
        self.policy.check(cache_manager)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preempted: list[Sequence] = []  # preempted by the latest `schedule` (the engine frees their rows)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """(sequence, number of new tokens to run) for this step."""
        self.preempted = []
        seats = self.config.max_num_seqs - len(self.running)
        if self.waiting and seats > 0:  # someone may be admitted: the policy says who comes first
            self.policy.order(self.waiting, self.cache_manager, seats)
        # BEGIN SOLUTION task2.schedule points=4
        budget = self.config.max_num_batched_tokens
        chunked = self.config.enable_chunked_prefill
        scheduled: list[tuple[Sequence, int]] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_pending_tokens, budget) if chunked else seq.num_pending_tokens
            if not n or n > budget:  # nothing to run yet, or too long for what is left of the budget
                i += 1
                continue
            while not self.cache_manager.allocate_slots(seq, n):
                victim = self.running.pop()
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                scheduled.append((seq, n))
                budget -= n
                i += 1
        # admit new work only when nothing had to be preempted: the pool is tight otherwise
        while not self.preempted and self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            match = self.cache_manager.get_computed_blocks(seq)
            n = seq.num_tokens - match.num_tokens
            if chunked:
                n = min(n, budget)
            elif n > budget:
                break
            if not self.cache_manager.allocate_slots(seq, n, match):
                break
            self.waiting.popleft()
            admit(self.cache_manager, seq, match)
            self.policy.on_admit(seq)
            self.running.append(seq)
            scheduled.append((seq, n))
            budget -= n
        return scheduled
        # END SOLUTION

    def _preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: release everything; the sequence restarts from token 0 later."""
        self.cache_manager.free(seq)
        seq.preempt()
        self.waiting.appendleft(seq)
        self.preempted.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.cache_manager.free(seq)
