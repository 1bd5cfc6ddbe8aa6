"""A stand-in for chapter 1's Transformer, written for the decode loop's tests, and the greedy sampler they hand to
`generate`: they run no attention, no RoPE and no sampling homework, so `generate` is graded on its own
(task1.decode_loop needs no other task).

Its next token is a fixed function of the whole context up to each row (`next_token`). With a KVCache it keeps
each token's id in the cache's own K tensor (`cache.k[0, position, 0, 0]`, the layout `KVCache` documents), never
calling `KVCache.attend`: a forward must start where the cache ends (`cache.length`), so a loop that passes the
wrong positions, forgets to advance the cache or runs a token twice fails here with a message that says so.
"""
from __future__ import annotations

import torch

from step01_kvcache.tiny import tiny_config


def next_token(context: list[int], vocab: int = 256) -> int:
    """The token that follows `context`: it depends on every token and on where each one stands."""
    return (31 * sum((i + 1) * t for i, t in enumerate(context)) + 7 * len(context)) % vocab


def argmax(logits: torch.Tensor, params, generator) -> int:
    """A sampler for `generate`: the greedy choice."""
    return int(logits.argmax())


def greedy_answer(prompt: list[int], max_new_tokens: int, stop: tuple[int, ...] = ()) -> list[int]:
    """What greedy decoding with the stand-in answers: each token the argmax after everything before it."""
    seq, out = list(prompt), []
    while len(out) < max_new_tokens:
        out.append(next_token(seq))
        seq.append(out[-1])
        if out[-1] in stop:
            break
    return out


class StandInModel:
    """The model contract `generate` uses: `config`, `device`, `dtype`, a forward `(input_ids [T], positions [T],
    cache or None) -> hidden [T, 1]` and `compute_logits(hidden [..., 1]) -> logits [..., vocab]`, whose argmax is
    `next_token` of each row's context. `calls` records every forward: (token ids, positions, with a cache)."""

    def __init__(self) -> None:
        self.config = tiny_config()
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.calls: list[tuple[list[int], list[int], bool]] = []

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv=None) -> torch.Tensor:
        ids, pos = [int(t) for t in input_ids], [int(p) for p in positions]
        self.calls.append((ids, pos, kv is not None))
        assert len(ids) == len(pos) > 0, f"a forward of {len(ids)} tokens at {len(pos)} positions"
        if kv is None:
            assert pos == list(range(len(ids))), f"without a cache a forward runs the whole sequence from 0, got {pos}"
            context = ids
        else:
            start = kv.length
            assert pos == list(range(start, start + len(ids))), \
                f"the cache holds {start} tokens, so this forward's positions are {start}.., got {pos}"
            assert start + len(ids) <= kv.max_len, "KV cache full"
            kv.k[0, start: start + len(ids), 0, 0] = torch.tensor(ids, dtype=kv.k.dtype)
            context = [int(t) for t in kv.k[0, : start + len(ids), 0, 0]]
        first = len(context) - len(ids)
        return torch.tensor([[float(next_token(context[: first + i + 1]))] for i in range(len(ids))])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(hidden[..., 0].long(), self.config.vocab_size).float()
