"""Continuous batching: every step, decide which sequences run and how many tokens each.

A step has a token budget (`max_num_batched_tokens`) and a seat limit (`max_num_seqs`). Running
sequences go first, in arrival order: a decode needs 1 token, an unfinished prefill takes what the
budget allows (chunked prefill, so a long prompt never stalls the decodes). When the pool is out of
blocks, the most recently admitted running sequence is preempted: its blocks are released and it goes
back to the front of the queue, to be recomputed later. Then waiting sequences are admitted while
budget, seats and blocks last. Nothing is ever half-allocated, so nothing leaks.
"""
from __future__ import annotations

from collections import deque

from .cache_manager import CacheManager
from .config import EngineConfig
from .sequence import Sequence, SequenceStatus


class Scheduler:
    """Reads the budget fields of the engine's config; asks the cache manager for memory."""

    def __init__(self, config: EngineConfig, kv: CacheManager) -> None:
        self.config, self.kv = config, kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Sequence, int]]:
        """(sequence, number of new tokens to run) for this step."""
        # BEGIN SOLUTION task2.schedule points=4
        budget = self.config.max_num_batched_tokens
        chunked = self.config.enable_chunked_prefill
        scheduled: list[tuple[Sequence, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_pending_tokens, budget) if chunked else seq.num_pending_tokens
            if n > budget:
                i += 1
                continue
            while not self.kv.allocate_slots(seq, n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled.append((seq, n))
                budget -= n
                i += 1
        # admit new work only when nothing had to be preempted: the pool is tight otherwise
        while not preempted and self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            match = self.kv.get_computed_blocks(seq)
            n = seq.num_tokens - match.num_tokens
            if chunked:
                n = min(n, budget)
            elif n > budget:
                break
            if not self.kv.allocate_slots(seq, n, match):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append((seq, n))
            budget -= n
        return scheduled
        # END SOLUTION

    def _preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: release everything; the sequence restarts from token 0 later."""
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
