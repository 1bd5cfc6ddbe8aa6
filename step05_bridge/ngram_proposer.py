"""Prompt lookup: draft tokens for speculative decoding without a second model.

When an answer quotes, edits or summarises its prompt, the next few tokens are often a copy of tokens the sequence
already holds. Prompt lookup (vLLM's `ngram` proposer, llama.cpp's `lookup`) bets on it: take the last n tokens of
the sequence, find the same n tokens earlier in it (prompt or answer), and propose the tokens that followed them
there. The longest n in [min_n, max_n] that occurs wins (a longer match is a better bet), and among its occurrences
the most recent one (the text being copied is usually the one just read). No match, no draft: the step is a plain
decode.

The search is an index kept as tokens arrive, not a scan: for each n, a dict from an n-gram to where it last ended.
A step indexes the tokens added since the previous one (O(new tokens x n sizes)) and looks up the current suffix
(O(n sizes)), so its cost follows what the step added, not the context (vLLM scans the whole sequence with KMP on
every step, compiled with numba). The index lives here, keyed by sequence id, for the sequence's whole life (a
preempted sequence keeps its tokens, so its index stays valid); the engine drops it when the request retires.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from step02_paged.sequence import Sequence

from .speculative_config import SpeculativeConfig


@dataclass
class _Index:
    """Where each n-gram of one sequence last ended, over its tokens 0 .. `indexed` - 1."""

    ends: dict[int, dict[tuple[int, ...], int]]
    indexed: int = 0


@dataclass
class NgramProposer:
    """Propose up to `max_tokens` drafts per sequence: what followed the most recent earlier occurrence of the
    sequence's longest suffix of `min_n` .. `max_n` tokens that occurs earlier."""

    min_n: int = 2
    max_n: int = 4
    _index: dict[int, _Index] = field(default_factory=dict, repr=False)

    @classmethod
    def from_config(cls, config: SpeculativeConfig) -> NgramProposer:
        """The proposer a speculative engine with this config uses (the config checked its n-gram sizes)."""
        return cls(config.prompt_lookup_min, config.prompt_lookup_max)

    def propose(self, seq: Sequence, max_tokens: int) -> list[int]:
        """At most `max_tokens` draft tokens to follow `seq`'s last token (none if no suffix occurs earlier)."""
        tokens = seq.all_token_ids
        last = len(tokens) - 1
        index = self._index.setdefault(seq.seq_id, _Index({n: {} for n in range(self.min_n, self.max_n + 1)}))
        # index every n-gram that ends before the last token: an occurrence must leave a token after it
        for end in range(index.indexed, last):
            for n, ends in index.ends.items():
                if end + 1 >= n:
                    ends[tuple(tokens[end + 1 - n: end + 1])] = end
        index.indexed = last  # a sequence's tokens only grow (drafts never enter them)
        if max_tokens <= 0:
            return []
        for n in range(self.max_n, self.min_n - 1, -1):
            if n > len(tokens):
                continue
            end = index.ends[n].get(tuple(tokens[len(tokens) - n:]))
            if end is not None:
                return tokens[end + 1: end + 1 + max_tokens]
        return []

    def drop(self, seq_id: int) -> None:
        """The request retired: forget its index."""
        self._index.pop(seq_id, None)

    def tracked(self) -> set[int]:
        """Ids of the sequences this proposer keeps an index for (the engine checks that all are live)."""
        return set(self._index)
