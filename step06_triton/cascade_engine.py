"""The engine with cascade attention: each decode step asks the cache which running sequences share a prefix, and
the attention reads each shared prefix once (cascade.py).

`Cascade` is a mixin over chapter 2's `Engine` (and chapter 6's `OverlapEngine`): it overrides `_prepare`, the
method that builds a step's `ForwardBatch`, to attach the step's groups. They come from the cache manager
(`shared_prefixes`: block reference counts in chapter 3, tree nodes in chapters 4 and 5), kept where they pay: a
prefix of at least `min_tokens` tokens (whole blocks) shared by at least `min_seqs` decode rows (vLLM uses cascade
attention from 256 shared tokens on, and not for small batches). Steps without such a group run plain decode.
"""
from __future__ import annotations

from step02_paged.engine import Engine
from step02_paged.forward_batch import ForwardBatch
from step02_paged.geometry import cdiv, check_positive_int
from step02_paged.sequence import Sequence

from .cascade import CascadeBatch, CascadeGroup
from .overlap import OverlapEngine

MIN_TOKENS = 256  # shared tokens from which a group is read once
MIN_SEQS = 8  # decode rows a group needs: a few rows gain less than the extra launch and merge cost


class Cascade:
    """Overrides `_prepare`: the step's decode rows grouped by the prefix they share, on the batch."""

    def __init__(self, *args, cascade_min_tokens: int = MIN_TOKENS, cascade_min_seqs: int = MIN_SEQS,
                 **kwargs) -> None:
        check_positive_int("cascade_min_tokens", cascade_min_tokens)
        check_positive_int("cascade_min_seqs", cascade_min_seqs)
        super().__init__(*args, **kwargs)
        self.cascade_min_tokens, self.cascade_min_seqs = cascade_min_tokens, cascade_min_seqs

    def _prepare(self, batch: list[tuple[Sequence, int]],
                 token_ids: list[int] | None = None) -> tuple[ForwardBatch, list[Sequence]]:
        forward_batch, sampled = super()._prepare(batch, token_ids)
        return CascadeBatch.of(forward_batch, self.cascade_groups(batch, forward_batch.num_decodes)), sampled

    def cascade_groups(self, batch: list[tuple[Sequence, int]], num_decodes: int) -> list[CascadeGroup]:
        """The decode rows (the batch's first `num_decodes`) that share at least `cascade_min_tokens` tokens,
        `cascade_min_seqs` of them or more, with the prefix each group shares."""
        decodes = [seq for seq, _ in batch[:num_decodes]]
        if len(decodes) < self.cascade_min_seqs:
            return []
        row = {seq.seq_id: i for i, seq in enumerate(decodes)}
        shared = self.cache_manager.shared_prefixes(decodes, cdiv(self.cascade_min_tokens, self.config.block_size))
        return [CascadeGroup(tuple(row[s.seq_id] for s in p.seqs), p.num_blocks * self.config.block_size)
                for p in shared if len(p.seqs) >= self.cascade_min_seqs]


class CascadeEngine(Cascade, Engine):
    """Chapter 2's engine, each decode step with cascade attention where a prefix is shared."""


class CascadeOverlapEngine(Cascade, OverlapEngine):
    """The overlapped engine, each decode step with cascade attention where a prefix is shared."""
