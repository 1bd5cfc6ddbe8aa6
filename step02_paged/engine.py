"""The continuous-batching engine: add requests any time; every `step()` runs one flat forward over the
scheduled tokens of all sequences, samples where a sequence reached its end, and retires finished ones.

The model is chapter 1's Transformer, unchanged: only its KV store is new (PagedAttention over a KVPool).
"""
from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from step01_kvcache.generate import SamplingParams, sample_next, validate_prompt
from step01_kvcache.model import Transformer

from .cache_manager import CacheManager, cdiv
from .config import EngineConfig
from .kv_cache_manager import KVCacheManager
from .kv_pool import KVPool
from .paged_attention import PagedAttention
from .scheduler import Scheduler
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
    """Memory over the engine's life: peak blocks held and how full the allocated slots were."""

    steps: int = 0
    peak_blocks: int = 0
    allocated_slot_steps: int = 0
    filled_slot_steps: int = 0

    @property
    def waste_fraction(self) -> float:
        """Allocated but unfilled slots / allocated slots, summed over all steps."""
        return 1 - self.filled_slot_steps / self.allocated_slot_steps if self.allocated_slot_steps else 0.0


class Engine:
    """One engine for every chapter; two seams choose what it runs on.

    `manager` builds the cache manager from the pool's geometry: any callable `(num_blocks, block_size) ->
    CacheManager`, usually the manager class itself (chapter 2's KVCacheManager pages without caching).
    `attention` is the KV store a step runs on: any class with `for_step(pool, block_tables, num_computed,
    num_new)` returning a KVStore that also knows the step's `positions` (chapter 1's seam)."""

    def __init__(self, model: Transformer, config: EngineConfig = EngineConfig(),
                 manager: Callable[[int, int], CacheManager] = KVCacheManager,
                 attention: type[PagedAttention] = PagedAttention) -> None:
        self.model, self.config, self.attention = model, config, attention
        self.kv = manager(config.num_blocks, config.block_size)
        self.pool = KVPool(model.config, config.num_blocks, config.block_size, model.dtype, model.device)
        self.scheduler = Scheduler(config, self.kv)
        self.seqs: dict[int, Sequence] = {}
        self.stats = EngineStats()
        self.last_scheduled: list[tuple[int, int]] = []  # (seq_id, tokens) of the latest step, for display
        self._next_id = 0

    # ---- requests ---------------------------------------------------------------------------------------
    def add_request(self, prompt_ids: Seq[int] | torch.Tensor, params: SamplingParams = SamplingParams(),
                    **options: object) -> int:
        """Queue a request; returns its id. `options` go to the cache manager's `new_sequence` (chapter 2's
        takes none). Rejects, with nothing queued, what could never run."""
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
        seq = self.kv.new_sequence(self._next_id, ids, params, **options)
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
        """Schedule, run one forward over all scheduled tokens, sample, retire. Returns finished requests."""
        batch = self.scheduler.schedule()
        if not batch:
            self.last_scheduled = []
            return []
        batch.sort(key=lambda item: item[1] != 1)  # single-token sequences first (batched decode attention)
        self.last_scheduled = [(s.seq_id, n) for s, n in batch]
        seqs = [s for s, _ in batch]
        counts = [n for _, n in batch]
        kv = self.attention.for_step(self.pool, [s.block_table for s in seqs],
                                     [s.num_computed_tokens for s in seqs], counts)
        tokens = [t for s, n in batch for t in s.all_token_ids[s.num_computed_tokens: s.num_computed_tokens + n]]
        hidden = self.model(torch.tensor(tokens, device=self.model.device), kv.positions, kv)
        ends = torch.tensor(counts).cumsum(0) - 1  # last row of each sequence
        sampling = [i for i, (s, n) in enumerate(batch) if s.num_computed_tokens + n == s.num_tokens]
        logits = self.model.compute_logits(hidden[ends[sampling]]) if sampling else None
        finished = []
        for seq, n in batch:
            seq.num_computed_tokens += n
            self.kv.on_computed(seq)
        greedy = logits.argmax(-1).tolist() if sampling else []  # one device -> host copy for the whole batch
        for row, i in enumerate(sampling):
            seq = seqs[i]
            token = greedy[row] if seq.params.temperature == 0 else sample_next(logits[row], seq.params, seq.generator)
            seq.append_token(token)
            if seq.is_finished:
                self.scheduler.finish(seq)
                finished.append(self._retire(seq))
        self.stats.steps += 1
        self._record_usage()
        return finished

    def _record_usage(self) -> None:
        """Sampled at the end of each step, over the sequences that still hold memory."""
        allocated, filled = self.kv.slot_usage()
        s = self.stats
        s.peak_blocks = max(s.peak_blocks, allocated // self.config.block_size)
        s.allocated_slot_steps += allocated
        s.filled_slot_steps += filled

    def _retire(self, seq: Sequence) -> RequestOutput:
        del self.seqs[seq.seq_id]
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
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
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
        """The cache manager's invariants; every live sequence is in exactly one queue; a drained engine holds
        nothing for requests."""
        self.kv.check_invariants()
        running, waiting = self.scheduler.running, self.scheduler.waiting
        assert len(running) <= self.config.max_num_seqs, "more running sequences than seats"
        ids = [s.seq_id for s in running] + [s.seq_id for s in waiting]
        assert sorted(ids) == sorted(self.seqs), "a live sequence is missing from the queues, or listed twice"
        for s in waiting:
            assert not s.block_table and s.num_computed_tokens == 0, f"waiting sequence {s.seq_id} holds blocks"
        for s in running:
            assert s.status is SequenceStatus.RUNNING and s.num_pending_tokens >= 1
        for s in self.seqs.values():
            s.check_invariants()
        if not self.has_unfinished():
            assert not self.kv.holders and self.kv.slot_usage() == (0, 0), "a drained engine still holds memory"
