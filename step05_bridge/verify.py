"""Speculative decoding's verify step: which drafts a sequence keeps, from the logits of one forward.

A sequence with drafts `d1 .. dm` runs its pending token and the drafts in one forward (a chunk of 1 + m tokens,
through the same path as a prefill chunk), and the step samples every one of those positions: row j holds the
model's distribution for the token after the first j drafts. The sequence keeps tokens in order: it samples row 0,
keeps that token, and goes on to row j + 1 only while the token it kept equals the draft `d(j+1)` the forward
assumed. So it keeps the longest prefix of drafts that agrees with its own samples, plus one token more: the
sample that disagreed, or, when every draft was accepted, a bonus token from the last row. A step never yields
fewer tokens than a plain decode, and at most m + 1.

Greedy rows are exact: the kept tokens are the argmax a plain decode would take at each position. Sampled rows
follow the rejection-sampling rule of Leviathan et al. (arXiv 2211.17192): accept a draft x with probability
min(1, p(x) / q(x)), else draw from max(0, p - q) normalised. Prompt lookup proposes one token with certainty
(q is one-hot on x), so that rule becomes: accept x with probability p(x), else draw from p without x, which is
exactly "sample from p with the request's own generator and accept x if the sample is x". Drawing once per kept
token, in order, consumes the generator as a plain decode would: a seeded request gets the same answer with
speculation on or off. (A proposer that is a model, with a spread-out q, needs the general rule and its residual
distribution.)
"""
from __future__ import annotations

import torch

from step01_kvcache.sampling import sample
from step02_paged.sequence import Sequence


def cut_drafts(batch: list[tuple[Sequence, int]]) -> None:
    """The scheduler gave a sequence `n` tokens, its pending token first: it verifies the first n - 1 of its drafts
    and drops the rest (a budget cut them off; they are proposed again if they still fit)."""
    for seq, n in batch:
        if len(seq.spec_token_ids) >= n:
            del seq.spec_token_ids[n - 1:]


def verify(logits: torch.Tensor, seqs: list[Sequence]) -> list[tuple[list[int], int]]:
    """`logits` holds 1 + len(drafts) rows per sequence of `seqs`, in order. Returns for each sequence the tokens it
    keeps and how many of its drafts were accepted. Keeping stops early at a stop token or at max_new_tokens."""
    greedy = logits.argmax(-1).tolist()  # every row's argmax in one read-back; sampled rows are drawn one by one
    kept_per_seq = []
    row = 0
    for seq in seqs:
        drafts, params = seq.spec_token_ids, seq.params
        room = params.max_new_tokens - len(seq.output_ids)
        kept: list[int] = []
        for j in range(len(drafts) + 1):
            token = greedy[row + j] if params.greedy else int(sample(logits[row + j], params, seq.generator))
            kept.append(token)
            if j == len(drafts) or token != drafts[j] or token in params.stop_token_ids or len(kept) >= room:
                break
        kept_per_seq.append((kept, num_accepted(kept, drafts)))
        row += len(drafts) + 1
    return kept_per_seq


def num_accepted(kept: list[int], drafts: list[int]) -> int:
    """How many drafts the kept tokens confirm: the length of their common prefix."""
    return next((i for i, (a, b) in enumerate(zip(kept, drafts)) if a != b), min(len(kept), len(drafts)))
