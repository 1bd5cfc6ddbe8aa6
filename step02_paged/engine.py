"""The continuous-batching engine: add requests any time; every `step()` runs one flat forward over the
scheduled tokens of all sequences, samples where a sequence reached its end, and retires finished ones.

The model is chapter 1's Transformer, unchanged: only its KV store is new (PagedAttention over a KVPool).

A step has two halves. `_launch` builds the step's inputs (`ForwardBatch`, in O(what the step runs)), runs the
forward and samples — on a GPU all of it is queued on the device and nothing waits. `_finish` reads the sampled
tokens back (the one host-device synchronisation of a step), appends them and retires finished requests. The
synchronous engine, the one this chapter teaches, runs the two back to back. With `EngineConfig(overlap=True)`
(chapter 6) step N+1 is scheduled and launched before step N's tokens are read, so the host's work hides behind
the device's: a decode whose token is still on the device runs with a placeholder that the device fills in, and a
request that finished is noticed one step late (the extra token it sampled is dropped).
"""
from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from step01_kvcache.attention import AttentionBackend
from step01_kvcache.model import Transformer
from step01_kvcache.request import SamplingParams, validate_prompt
from step01_kvcache.sampling import sample

from .block_table import BlockTable
from .cache_manager import CacheManager, cdiv
from .config import EngineConfig
from .forward_batch import ForwardBatch
from .kv_cache_manager import KVCacheManager
from .kv_pool import KVPool
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


@dataclass
class Launched:
    """A step whose forward is queued: which sequences it samples, and their tokens (on the device, and a host
    copy on its way)."""

    sampled: list[Sequence]
    tokens: torch.Tensor  # [len(sampled)] on the model's device
    index: dict[int, int] = field(default_factory=dict)  # seq_id -> its token's index in `tokens`
    host: torch.Tensor | None = None  # pinned host copy, filled once `ready` has passed
    ready: torch.cuda.Event | None = None

    def read(self) -> list[int]:
        """The sampled tokens as ints: the one point where the host waits for the device."""
        if self.ready is None:
            return self.tokens.tolist()
        self.ready.synchronize()
        return self.host.tolist()


class Engine:
    """One engine for every chapter; two seams choose what it runs on, and a policy the order of admission.

    `manager` builds the cache manager from the pool's geometry: any callable `(num_blocks, block_size) ->
    CacheManager`, usually the manager class itself (chapter 2's KVCacheManager pages without caching).
    `attention` is the attention backend (chapter 1's `AttentionBackend`): `for_step(pool, batch)` returns the
    step's KV store. `policy` orders the waiting queue before each admission (the scheduler's `Policy`; by
    default first come, first served); it belongs to this engine alone, since it may keep state."""

    def __init__(self, model: Transformer, config: EngineConfig = EngineConfig(),
                 manager: Callable[[int, int], CacheManager] = KVCacheManager,
                 attention: AttentionBackend = PagedAttention, policy: Policy | None = None) -> None:
        self.model, self.config, self.attention = model, config, attention
        self.cache_manager = manager(config.num_blocks, config.block_size)
        self.pool = KVPool(model.config, config.num_blocks, config.block_size, model.dtype, model.device)
        self.cache_manager.pool = self.pool
        self.block_table = BlockTable(config.max_num_seqs, cdiv(model.config.max_position_embeddings,
                                                                config.block_size), model.device)
        self.scheduler = Scheduler(config, self.cache_manager, policy)
        self.seqs: dict[int, Sequence] = {}
        self.stats = EngineStats()
        self.last_scheduled: list[tuple[int, int]] = []  # (seq_id, tokens) of the latest step, for display
        self._inflight: Launched | None = None  # overlap: the step launched last, its tokens not read yet
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
        return self.scheduler.has_unfinished() or self._inflight is not None

    # ---- one step -----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Schedule, launch one forward over all scheduled tokens, read the sampled tokens, retire. Returns the
        requests that finished. With overlap, the tokens read are the previous step's."""
        batch = self.scheduler.schedule()
        for seq in self.scheduler.preempted:
            self.block_table.release(seq.seq_id)
        launched = self._launch(batch) if batch else None
        if self.config.overlap:
            launched, self._inflight = self._inflight, launched
        finished = self._finish(launched) if launched else []
        if batch:
            self.stats.steps += 1
            self._record_usage()
        return finished

    def _launch(self, batch: list[tuple[Sequence, int]]) -> Launched:
        """Build the step's inputs, queue the forward and the sampling; advance every sequence's counter."""
        batch.sort(key=lambda item: item[1] != 1)  # single-token sequences first (batched decode attention)
        self.last_scheduled = [(s.seq_id, n) for s, n in batch]
        seqs = [s for s, _ in batch]
        counts = [n for _, n in batch]
        # the rows where a sequence reaches its last token, and samples
        rows = [i for i, (s, n) in enumerate(batch) if s.num_computed_tokens + n == s.num_tokens + s.num_placeholders]
        previous = self._inflight
        fb = ForwardBatch.build(seqs, counts, self.block_table, self.config.block_size, rows,
                                previous.index if previous else None, previous.tokens if previous else None)
        hidden = self.model(fb.input_ids, fb.positions, self.attention.for_step(self.pool, fb))
        sampled = [seqs[i] for i in rows]
        # every row sampled (a decode step): the rows as the model returned them (a CUDA graph's logits are ready)
        last = hidden if len(rows) == hidden.shape[0] else hidden[fb.logits_indices]
        tokens = self._sample(last, sampled) if rows else fb.logits_indices  # (empty)
        for seq, n in batch:
            seq.advance(n)
            self.cache_manager.on_computed(seq)
        for seq in sampled:
            seq.num_placeholders += 1
        launched = Launched(sampled, tokens, {s.seq_id: i for i, s in enumerate(sampled)})
        if tokens.is_cuda:  # start the copy back now; `read` waits for it only when the tokens are needed
            launched.host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            launched.host.copy_(tokens, non_blocking=True)
            launched.ready = torch.cuda.Event()
            launched.ready.record()
        return launched

    def _sample(self, hidden: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One token per row, on the device: greedy rows in one argmax, the others with their own generator."""
        logits = self.model.compute_logits(hidden)
        tokens = logits.argmax(-1)
        for row, seq in enumerate(seqs):
            if not seq.params.greedy:
                tokens[row] = sample(logits[row], seq.params, seq.generator)
        return tokens

    def _finish(self, launched: Launched) -> list[RequestOutput]:
        """Read a launched step's tokens; append them; retire what finished. A sequence that finished or was
        aborted since the launch drops its token."""
        finished = []
        for seq, token in zip(launched.sampled, launched.read()):
            seq.num_placeholders -= 1
            if seq.is_finished:
                continue
            seq.append_token(token)
            if seq.is_finished:
                self.scheduler.finish(seq)
                finished.append(self._retire(seq))
        return finished

    def _record_usage(self) -> None:
        """Sampled at the end of each step, over the sequences that still hold memory: O(running), from counts
        the managers keep (never a walk over every block table)."""
        allocated, filled = self.cache_manager.slot_usage()
        s = self.stats
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
        """The cache manager's invariants; every live sequence is in exactly one queue; running sequences' block
        table rows match their tables; a drained engine holds nothing for requests."""
        self.cache_manager.check_invariants()
        running, waiting = self.scheduler.running, self.scheduler.waiting
        assert len(running) <= self.config.max_num_seqs, "more running sequences than seats"
        ids = [s.seq_id for s in running] + [s.seq_id for s in waiting]
        assert sorted(ids) == sorted(self.seqs), "a live sequence is missing from the queues, or listed twice"
        for s in waiting:
            assert not s.block_table and s.num_computed_tokens == 0, f"waiting sequence {s.seq_id} holds blocks"
            assert s.seq_id not in self.block_table.rows, f"waiting sequence {s.seq_id} holds a block-table row"
        for s in running:
            assert s.status is SequenceStatus.RUNNING and s.num_pending_tokens >= 1
        for s in self.seqs.values():
            s.check_invariants()
        self.block_table.check_invariants(running)
        if not self.has_unfinished():
            assert not self.cache_manager.holders and self.cache_manager.slot_usage() == (0, 0), \
                "a drained engine still holds memory"
            assert not self.block_table.rows, "a drained engine still holds block-table rows"
