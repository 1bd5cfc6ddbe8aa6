"""Pictures of chapter 1's cache: one sequence's contiguous K/V buffers, position by position (DOT).

`kv_cache_dot` draws what `KVCache` allocates before the first token, `[num_layers, max_len, ...]` for K and
for V, and how far `length` has filled it: the part past `length` is reserved for this sequence alone and
holds nothing yet, which is the waste chapter 2's paging removes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

import torch

from course.draw import Dot, word_ids, words
from step01_kvcache.tiny import tiny_model

from .kv_cache import KVCache

FILLED, RESERVED = "#ceead6", "#e8eaed"


def kv_cache_dot(cache: KVCache, token_ids: Sequence[int], decode: Callable[[list[int]], str] | None = None,
                 name: str = "kv_cache") -> str:
    """A grid: a column per position 0..max_len-1 (headed by the token whose K/V it holds), a row for K and for
    V of each layer. Positions below `cache.length` are filled (green) in every row at once; the rest are
    reserved (grey): allocated when the request started, sized for the longest answer it may give."""
    num_layers, max_len, heads, head_dim = cache.k.shape
    n = cache.length
    dot = Dot(name, rankdir="TB", ranksep="0.15")

    def token(p: int) -> str:
        if p >= n or p >= len(token_ids):
            return "·"
        return escape(decode([token_ids[p]]) if decode else str(token_ids[p]))

    header = "<TD></TD>" + "".join(f"<TD>{p}<BR/>{token(p)}</TD>" for p in range(max_len))
    rows = [f"<TR>{header}</TR>"]
    for layer in range(num_layers):
        for kind in ("K", "V"):
            cells = "".join(f'<TD BGCOLOR="{FILLED if p < n else RESERVED}">{"■" if p < n else " "}</TD>'
                            for p in range(max_len))
            rows.append(f'<TR><TD ALIGN="RIGHT">layer {layer} {kind}</TD>{cells}</TR>')
    dot.raw(f'"cache" [shape=plaintext, style="", fontsize=9, label=<<TABLE BORDER="0" CELLBORDER="1" '
            f'CELLSPACING="0" CELLPADDING="3">{"".join(rows)}</TABLE>>];')
    used = cache.nbytes() * n // max_len
    dot.node("shape", f"KVCache.k and .v: [num_layers {num_layers}, max_len {max_len}, kv heads {heads}, "
             f"head_dim {head_dim}] each\nlength {n}: positions 0..{n - 1} filled, {max_len - n} reserved and empty"
             f"\n{cache.nbytes()} bytes allocated up front, {used} in use\n", shape="note", fillcolor="#e8f0fe")
    dot.edge("shape", "cache", style="invis")
    return dot.source()


def lesson_figures() -> dict[str, str]:
    """The README's picture: a tiny model (random weights, chapter 1's code) prefills a 6-token prompt in one
    forward, then runs two answer tokens one step each, into a cache sized as `generate` sizes it for
    max_new_tokens = 6. The answer is written in, not sampled: the cache stores whatever tokens run."""
    model = tiny_model(seed=0)
    prompt, answer = word_ids("<s> user What is 2+2 ?"), word_ids("It is")
    cache = KVCache(model.config, max_len=len(prompt) + 6)
    with torch.inference_mode():
        for chunk in [prompt] + [[t] for t in answer]:  # the prefill, then one decode step per token
            start = cache.length
            model(torch.tensor(chunk), torch.arange(start, start + len(chunk)), cache)
            cache.advance(len(chunk))
    return {"contiguous_cache": kv_cache_dot(cache, prompt + answer, words, name="contiguous_cache")}
