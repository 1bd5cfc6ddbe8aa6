"""Which decode rows read a shared prefix once: the cascade policy an engine holds (plain or overlapped alike).

Each decode step the engine asks its policy for the step's groups (chapter 2's `Engine._prepare`), and they ride on
the step's `ForwardBatch` (`cascade`) to the attention backend, which reads each group's prefix once (cascade.py).
The groups come from the cache manager (`shared_prefixes`: block reference counts in chapter 3, tree nodes in
chapters 4 and 5), kept where they pay: a prefix of at least `min_tokens` tokens (whole blocks) shared by at least
`min_seqs` decode rows (vLLM uses cascade attention from 256 shared tokens on, and not for small batches). Steps
without such a group run plain decode.
"""
from __future__ import annotations

from dataclasses import dataclass

from step02_paged.cache_manager import CacheManager
from step02_paged.forward_batch import CascadeGroup
from step02_paged.geometry import cdiv, check_positive_int
from step02_paged.sequence import Sequence

MIN_TOKENS = 256  # shared tokens from which a group is read once
MIN_SEQS = 8  # decode rows a group needs: a few rows gain less than the extra launch and merge cost


@dataclass(frozen=True)
class CascadePolicy:
    """Group a step's decode rows by the prefix they share: `min_tokens` tokens or more, `min_seqs` rows or more."""

    min_tokens: int = MIN_TOKENS
    min_seqs: int = MIN_SEQS

    def __post_init__(self) -> None:
        check_positive_int("cascade_min_tokens", self.min_tokens)
        check_positive_int("cascade_min_seqs", self.min_seqs)

    def groups(self, decodes: list[Sequence], cache_manager: CacheManager) -> tuple[CascadeGroup, ...]:
        """`decodes`, the step's decode rows in batch order, grouped by the prefix each group shares."""
        if len(decodes) < self.min_seqs:
            return ()
        row = {seq.seq_id: i for i, seq in enumerate(decodes)}
        bs = cache_manager.block_size
        shared = cache_manager.shared_prefixes(decodes, cdiv(self.min_tokens, bs))
        return tuple(CascadeGroup(tuple(row[s.seq_id] for s in p.seqs), p.num_blocks * bs)
                     for p in shared if len(p.seqs) >= self.min_seqs)
