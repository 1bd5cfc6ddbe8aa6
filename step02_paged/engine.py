"""The continuous-batching engine: add requests any time; every `step()` runs one flat forward over the
scheduled tokens of all sequences, samples where a sequence reached its end, and retires finished ones.

The model is chapter 1's Transformer, unchanged: only its KV store is new (PagedAttention over a KVPool).

A step reads top to bottom: the scheduler picks who runs and how many tokens each; `_prepare` builds the step's
inputs (`ForwardBatch`, in O(what the step runs)); the runner turns the batch into the logits of the sampled rows;
`_sample` picks one token per row; `_advance` moves every sequence's counter past what the forward computed (after
it, so that a forward that raised changes nothing); `_append` adds the tokens and retires what finished. Everything
happens in the step that scheduled it, so the host waits for the forward (on a GPU that wait is what chapter 6's
overlapped engine removes, by overriding `step`).

An engine that extends this one overrides a step's parts (`step`, `_prepare`, `_advance`, `_retire`,
`check_invariants`), never adds a branch to them: chapters 5 and 6 build theirs that way.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

import torch

from step01_kvcache.config import ModelConfig
from step01_kvcache.model import Transformer
from step01_kvcache.request import SamplingParams, validate_prompt
from step01_kvcache.sampling import sample

from .attention_backend import AttentionBackend
from .block_table import BlockTable
from .cache_manager import CacheManager
from .config import EngineConfig
from .forward_batch import CascadeGroup, ForwardBatch, decodes_first
from .geometry import PoolGeometry, cdiv
from .kv_cache_manager import KVCacheManager
from .kv_pool import KVPool
from .model_runner import ModelRunner
from .paged_attention import PagedAttention
from .scheduler import Policy, Scheduler
from .sequence import Sequence, SequenceStatus

__all__ = ["Engine", "EngineConfig", "EngineStats", "RequestOutput"]


@dataclass(frozen=True)
class RequestOutput:
    seq_id: int
    prompt_ids: list[int]
    output_ids: list[int]
    num_cached_tokens: int
    num_preemptions: int
    ttft_s: float  # arrival -> first generated token
    latency_s: float  # arrival -> finished
    aborted: bool = False


@dataclass
class EngineStats:
    """Counted over the engine's life: peak blocks held and how full the allocated slots were."""

    steps: int = 0
    peak_blocks: int = 0
    allocated_slot_steps: int = 0
    filled_slot_steps: int = 0

    @property
    def waste_fraction(self) -> float:
        """Allocated but unfilled slots / allocated slots, summed over all steps."""
        return 1 - self.filled_slot_steps / self.allocated_slot_steps if self.allocated_slot_steps else 0.0


class CascadePolicy(Protocol):
    """Groups a step's decode rows (in batch order) by a prefix they share, from what the cache manager counts."""

    def groups(self, decodes: list[Sequence], cache_manager: CacheManager) -> tuple[CascadeGroup, ...]:
        ...


class Engine:
    """One engine for every chapter; two seams choose what it runs on, and a policy the order of admission.

    `manager` builds the cache manager from the pool: any callable `(geometry, pool) -> CacheManager`, usually the
    manager class itself (chapter 2's KVCacheManager pages without caching). `attention` is the attention backend
    (attention_backend.py's contract): `for_step(pool, batch)` returns the step's KV store. `policy` orders the
    waiting queue before each admission (the scheduler's `Policy`; by default first come, first served); it
    belongs to this engine alone, since it may keep state. `runner` makes the one object that runs the model
    (`ModelRunner`: eager; chapter 6 replays CUDA graphs). `pool` builds the KV pool from the model's config, the
    geometry, the model's dtype and device (`KVPool`: K/V in the model's dtype; a pool may store them otherwise).
    `cascade` groups each step's decode rows by a prefix they share, for a backend that reads it once (chapter 6's
    `CascadePolicy`); None: no groups, every row reads its whole context."""

    def __init__(self, model: Transformer, config: EngineConfig = EngineConfig(),
                 manager: Callable[[PoolGeometry, KVPool], CacheManager] = KVCacheManager,
                 attention: AttentionBackend = PagedAttention, policy: Policy | None = None,
                 runner: Callable[[Transformer, AttentionBackend, KVPool], ModelRunner] = ModelRunner,
                 pool: Callable[[ModelConfig, PoolGeometry, torch.dtype, torch.device], KVPool] = KVPool,
                 cascade: CascadePolicy | None = None) -> None:
        self.model, self.config, self.attention, self.cascade = model, config, attention, cascade
        geometry = config.geometry
        self.pool = pool(model.config, geometry, model.dtype, model.device)
        self.cache_manager = manager(geometry, self.pool)
        self.block_table = BlockTable(config.max_num_seqs, cdiv(model.config.max_position_embeddings,
                                                                config.block_size), model.device)
        self.runner = runner(model, attention, self.pool)
        self.scheduler = Scheduler(config, self.cache_manager, policy)
        self.seqs: dict[int, Sequence] = {}
        self.stats = EngineStats()
        self.last_scheduled: list[tuple[int, int]] = []  # (seq_id, tokens) of the latest step, for display
        self._next_id = 0

    # ---- requests ---------------------------------------------------------------------------------------
    def add_request(self, prompt_ids: Seq[int] | torch.Tensor, params: SamplingParams = SamplingParams(),
                    **options: object) -> int:
        """Queue a request; returns its id. `options` go to the cache manager's `new_sequence` (chapter 2's
        takes none). Rejects, with nothing queued, what could never run."""
        return self._queue(self._check_request(prompt_ids, params), params, options)

    def _check_request(self, prompt_ids: Seq[int] | torch.Tensor, params: SamplingParams) -> list[int]:
        """The prompt as a list of ints, once everything about the request is known to be runnable; a
        ValueError that says what to fix otherwise."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        ids = validate_prompt(self.model.config, prompt_ids, params.max_new_tokens)
        cfg = self.config
        longest = len(ids) + params.max_new_tokens - 1  # the last sampled token is never stored
        if cdiv(longest, cfg.block_size) > cfg.num_blocks:
            raise ValueError(f"prompt ({len(ids)}) + max_new_tokens ({params.max_new_tokens}) needs up to "
                             f"{cdiv(longest, cfg.block_size)} blocks but the pool has only {cfg.num_blocks}; "
                             "raise num_blocks or shorten the request")
        if not cfg.enable_chunked_prefill and longest > cfg.max_num_batched_tokens:
            raise ValueError(f"without chunked prefill a {longest}-token sequence must fit the step budget "
                             f"max_num_batched_tokens={cfg.max_num_batched_tokens}; enable chunked prefill")
        vocab = self.model.config.vocab_size
        if any(t >= vocab for t in params.stop_token_ids):
            raise ValueError(f"stop_token_ids {params.stop_token_ids} are not all in the vocabulary 0..{vocab - 1}")
        return ids

    def _queue(self, ids: list[int], params: SamplingParams, options: dict) -> int:
        seq = self.cache_manager.new_sequence(self._next_id, ids, params, **options)
        seq.generator = params.make_generator(self.model.device)
        self._next_id += 1
        self.seqs[seq.seq_id] = seq
        self.scheduler.add(seq)
        return seq.seq_id

    def abort(self, seq_id: int) -> RequestOutput:
        seq = self.seqs.get(seq_id)
        if seq is None or seq.is_finished:
            raise KeyError(f"no unfinished request {seq_id}")
        seq.status = SequenceStatus.ABORTED
        self.scheduler.finish(seq)
        return self._retire(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- one step -----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Schedule, run one forward over all scheduled tokens, sample, append, retire. Returns the requests that
        finished."""
        batch = self._schedule()
        if not batch:
            return []
        forward_batch, sampled = self._prepare(batch)
        tokens = self._sample(self.runner.forward(forward_batch), sampled)
        self._advance(batch)
        finished = self._append(sampled, tokens.tolist())
        self._record_step()
        return finished

    def _schedule(self) -> list[tuple[Sequence, int]]:
        """The scheduler's batch, decodes first. Preempted sequences give their block-table rows back (their blocks
        went back already), also when scheduling raised midway: the preemptions it made stand."""
        try:
            return decodes_first(self.scheduler.schedule())
        finally:
            for seq in self.scheduler.preempted:
                self.block_table.release(seq.seq_id)

    def _prepare(self, batch: list[tuple[Sequence, int]],
                 token_ids: list[int] | None = None) -> tuple[ForwardBatch, list[Sequence]]:
        """The step's inputs (`batch` has its decodes first; `token_ids` by default the sequences' own), and the
        sequences it samples: those that run all their pending tokens."""
        self.last_scheduled = [(s.seq_id, n) for s, n in batch]
        seqs = [s for s, _ in batch]
        rows = [i for i, (s, n) in enumerate(batch) if n == s.num_pending_tokens]
        forward_batch = ForwardBatch.build(seqs, [n for _, n in batch], self.block_table, self.config.block_size,
                                           rows, token_ids)
        if self.cascade is not None:
            groups = self.cascade.groups(seqs[: forward_batch.num_decodes], self.cache_manager)
            forward_batch = dataclasses.replace(forward_batch, cascade=groups)
        return forward_batch, [seqs[i] for i in rows]

    def _advance(self, batch: list[tuple[Sequence, int]]) -> None:
        """The forward ran: every sequence's counter moves past the tokens it computed, and its cache manager hears
        of it (a prefix cache publishes what became reusable). Only after the forward: a forward that raised leaves
        every counter where it was."""
        for seq, n in batch:
            seq.advance(n)
            self.cache_manager.on_computed(seq)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One token per row, on the device: greedy rows in one argmax, the others with their own generator."""
        tokens = logits.argmax(-1)
        for row, seq in enumerate(seqs):
            if not seq.params.greedy:
                tokens[row] = sample(logits[row], seq.params, seq.generator)
        return tokens

    def _append(self, seqs: list[Sequence], tokens: list[int]) -> list[RequestOutput]:
        """Append each sampled token to its sequence; retire the sequences that finished."""
        finished = []
        for seq, token in zip(seqs, tokens):
            seq.append_token(token)
            if seq.is_finished:
                self.scheduler.finish(seq)
                finished.append(self._retire(seq))
        return finished

    def _record_step(self) -> None:
        """Count the step and sample the memory held at its end, over the sequences that still hold memory:
        O(running), from counts the managers keep (never a walk over every block table)."""
        allocated, filled = self.cache_manager.slot_usage()
        s = self.stats
        s.steps += 1
        s.peak_blocks = max(s.peak_blocks, allocated // self.config.block_size)
        s.allocated_slot_steps += allocated
        s.filled_slot_steps += filled

    def _retire(self, seq: Sequence) -> RequestOutput:
        del self.seqs[seq.seq_id]
        self.block_table.release(seq.seq_id)
        end = seq.finish_time or seq.first_token_time or seq.arrival_time
        first = seq.first_token_time or end
        return RequestOutput(seq.seq_id, seq.prompt_ids, list(seq.output_ids), seq.num_cached_tokens,
                             seq.num_preemptions, first - seq.arrival_time, end - seq.arrival_time,
                             seq.status is SequenceStatus.ABORTED)

    # ---- convenience ------------------------------------------------------------------------------------
    def generate(self, prompts: list[Seq[int]], params: SamplingParams | list[SamplingParams] = SamplingParams(),
                 progress: bool = False) -> list[RequestOutput]:
        """Run prompts to completion; outputs in the order of `prompts`."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        checked = [self._check_request(p, sp) for p, sp in zip(prompts, plist)]  # all, before any is queued
        ids = [self._queue(p, sp, {}) for p, sp in zip(checked, plist)]
        done: dict[int, RequestOutput] = {}
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(ids), desc="requests", unit="req")
        while self.has_unfinished():
            for out in self.step():
                done[out.seq_id] = out
                if bar:
                    bar.update(1)
        if bar:
            bar.close()
        return [done[i] for i in ids]

    @property
    def kv_bytes_per_block(self) -> int:
        return self.pool.bytes_per_block

    def check_invariants(self) -> None:
        """The cache manager's invariants; every live sequence is in exactly one queue; running sequences' block
        table rows match their tables; a drained engine holds nothing for requests."""
        self.cache_manager.check_invariants()
        running, waiting = self.scheduler.running, self.scheduler.waiting
        assert len(running) <= self.config.max_num_seqs, "more running sequences than seats"
        ids = [s.seq_id for s in running] + [s.seq_id for s in waiting]
        assert sorted(ids) == sorted(self.seqs), "a live sequence is missing from the queues, or listed twice"
        assert set(self.cache_manager.holders) <= {s.seq_id for s in running}, \
            "the cache manager holds memory for a sequence that is not running"
        for s in waiting:
            assert not s.block_table and s.num_computed_tokens == 0, f"waiting sequence {s.seq_id} holds blocks"
            assert s.seq_id not in self.block_table.rows, f"waiting sequence {s.seq_id} holds a block-table row"
        for s in running:
            assert s.status is SequenceStatus.RUNNING and not s.is_stalled, \
                f"running sequence {s.seq_id} has nothing to run and waits for nothing"
        for s in self.seqs.values():
            s.check_invariants()
        self.block_table.check_invariants(running)
        if not self.has_unfinished():
            assert not self.cache_manager.holders and self.cache_manager.slot_usage() == (0, 0), \
                "a drained engine still holds memory"
            assert not self.block_table.rows, "a drained engine still holds block-table rows"
