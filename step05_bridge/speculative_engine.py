"""SpeculativeEngine: chapter 2's engine, decoding up to 1 + k tokens of a sequence in one step.

A decode step of a small model reads every weight and the whole context to produce one token; the same forward over
1 + k tokens costs little more, because it reads the same bytes. Speculative decoding spends that slack: a cheap
proposer guesses the next k tokens (prompt lookup, ngram_proposer.py), one forward runs the pending token and the
guesses (a chunk, through the same path as a prefill chunk), and the verify rule (verify.py) keeps the guesses
the model agrees with, plus one token of its own. The answer is the one plain decoding gives, token for token.

It lives here, after the three prefix caches, because its hard part is theirs: a rejected guess already has K/V in
the pool, written by the forward, and every design must give back what only the rejected guesses used without ever
having published them. The engine keeps that order (rollback.py): a sequence's counter moves past what the forward
computed, moves back over the rejected guesses (`rollback`), the cache manager gives back the blocks only they used
(`release_rejected_blocks`), and only then hears of the step (`on_computed`): a hash, a tree node or an insert never
sees an unverified token.

What it changes in chapter 2's step, by overriding and nothing else:
- `_prepare`: a budget may have cut a sequence's guesses; those it cut are dropped before the batch is built;
- `step`: after the forward, `_verify` takes the place of `_sample`, `_advance` and `_append`, then `_propose` finds
  the next guesses of every sequence still decoding;
- `_retire`: the proposer forgets a retired request; `check_invariants`: no sequence holds more than k guesses, and
  the proposer indexes live requests only.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from step01_kvcache.config import ModelConfig
from step01_kvcache.model import Transformer
from step02_paged.attention_backend import AttentionBackend
from step02_paged.cache_manager import CacheManager
from step02_paged.config import EngineConfig
from step02_paged.engine import Engine, EngineStats, RequestOutput
from step02_paged.forward_batch import ForwardBatch
from step02_paged.geometry import PoolGeometry
from step02_paged.kv_cache_manager import KVCacheManager
from step02_paged.kv_pool import KVPool
from step02_paged.model_runner import ModelRunner
from step02_paged.paged_attention import PagedAttention
from step02_paged.scheduler import Policy
from step02_paged.sequence import Sequence, SequenceStatus

from .ngram_proposer import NgramProposer
from .rollback import release_rejected_blocks, rollback
from .speculative_config import SpeculativeConfig
from .verify import cut_drafts, verify


@dataclass
class SpeculativeStats(EngineStats):
    """Chapter 2's counts, and the guesses: how many were verified, how many the model agreed with."""

    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted guesses / verified guesses."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


class SpeculativeEngine(Engine):
    """Chapter 2's engine with a proposer: `speculative.num_speculative_tokens` = k guesses verified per decode
    step. The proposer is prompt lookup (`NgramProposer`) unless another object with `propose`, `drop` and `tracked`
    is given."""

    def __init__(self, model: Transformer, config: EngineConfig,
                 manager: Callable[[PoolGeometry, KVPool], CacheManager] = KVCacheManager,
                 attention: AttentionBackend = PagedAttention, policy: Policy | None = None,
                 runner: Callable[[Transformer, AttentionBackend, KVPool], ModelRunner] = ModelRunner,
                 proposer: NgramProposer | None = None,
                 pool: Callable[[ModelConfig, PoolGeometry, torch.dtype, torch.device], KVPool] = KVPool, *,
                 speculative: SpeculativeConfig) -> None:
        if not isinstance(speculative, SpeculativeConfig):
            raise TypeError(f"speculative must be a SpeculativeConfig(num_speculative_tokens=k), got {speculative!r}")
        super().__init__(model, config, manager, attention, policy, runner, pool)
        self.speculative = speculative
        self.proposer = proposer or NgramProposer.from_config(speculative)
        self.stats = SpeculativeStats()

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Schedule, run one forward over every scheduled token (guesses included), verify, propose."""
        batch = self._schedule()
        if not batch:
            return []
        forward_batch, sampled = self._prepare(batch)
        return self._verify(batch, self.runner.forward(forward_batch), sampled)

    def _prepare(self, batch: list[tuple[Sequence, int]],
                 token_ids: list[int] | None = None) -> tuple[ForwardBatch, list[Sequence]]:
        """Chapter 2's batch, after dropping the guesses the budget cut off (they run after a sequence's pending token,
        so the cut ones are the last)."""
        cut_drafts(batch)
        return super()._prepare(batch, token_ids)

    def _verify(self, batch: list[tuple[Sequence, int]], logits: torch.Tensor,
                sampled: list[Sequence]) -> list[RequestOutput]:
        """Every sampled sequence keeps the guesses its own samples agree with and one token more (`verify`). The
        forward computed every scheduled position; each sequence advances past them, then rolls back over its rejected
        guesses, before the cache manager hears of the step. Then the kept tokens join their sequences and the
        survivors get new guesses."""
        kept = verify(logits, sampled)
        rejected = {}
        for seq, (_, accepted) in zip(sampled, kept):
            self.stats.draft_tokens += len(seq.spec_token_ids)
            self.stats.accepted_tokens += accepted
            rejected[seq.seq_id] = len(seq.spec_token_ids) - accepted
            seq.spec_token_ids = []
        for seq, n in batch:
            seq.advance(n)
            if rejected.get(seq.seq_id):
                rollback(seq, rejected[seq.seq_id])
                release_rejected_blocks(self.cache_manager, seq)
            self.cache_manager.on_computed(seq)
        finished = self._append([s for s, (tokens, _) in zip(sampled, kept) for _ in tokens],
                                [t for tokens, _ in kept for t in tokens])
        self._propose(sampled)
        self._record_step()
        return finished

    def _propose(self, seqs: list[Sequence]) -> None:
        """Guesses for the next step of every sequence here that still decodes: at most k, never more than its answer
        has room for after the token the step always yields, and never more than the token budget has room for beside
        one token of every running sequence (so that, even without chunked prefill, every running decode fits)."""
        spare = self.config.max_num_batched_tokens - len(self.scheduler.running)
        for seq in seqs:
            if seq.is_finished or seq.status is not SequenceStatus.RUNNING:
                continue
            k = self.speculative.num_speculative_tokens
            room = min(k, seq.params.max_new_tokens - len(seq.output_ids) - 1, spare)
            seq.spec_token_ids = self.proposer.propose(seq, room)
            spare -= len(seq.spec_token_ids)

    def _retire(self, seq: Sequence) -> RequestOutput:
        self.proposer.drop(seq.seq_id)
        return super()._retire(seq)

    def check_invariants(self) -> None:
        """Chapter 2's, no sequence with more than k guesses, and no index of a retired request."""
        super().check_invariants()
        k = self.speculative.num_speculative_tokens
        for s in self.seqs.values():
            assert len(s.spec_token_ids) <= k, f"sequence {s.seq_id}: too many drafts"
        assert self.proposer.tracked() <= set(self.seqs), "the proposer keeps an index of a retired request"
