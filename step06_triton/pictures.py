"""Pictures of chapter 6 (DOT source; `python -m course figures` writes figures/split_kv.{dot,svg}).

`split_kv_dot` draws one sequence's split-KV decode: which program (one per KV head and split) walks which
tiles of the context, and where each tile's tokens live in the pool through the block table.
"""
from __future__ import annotations

import sys

from course.draw import Dot
from step02_paged.geometry import cdiv

SPLIT_COLORS = ["#fde293", "#ceead6", "#d2e3fc", "#f6aea9", "#e6d3f5", "#fbd2b4"]


def split_ranges(seq_len: int, num_splits: int, block_n: int) -> list[tuple[int, int]]:
    """[start, end) of each of `num_splits` programs, as `_decode_split_kernel` cuts a sequence the launch rule
    asks to split that many times: equal runs of whole tiles. Rounding to tiles can leave the last programs
    nothing; the rule then counts fewer splits and those programs return at once."""
    tiles = cdiv(seq_len, block_n)
    split_len = cdiv(tiles, num_splits) * block_n
    return [(min(s * split_len, seq_len), min((s + 1) * split_len, seq_len)) for s in range(num_splits)]


def split_kv_dot(block_table: list[int], seq_len: int, block_size: int, num_splits: int, block_n: int,
                 num_blocks: int, name: str = "split_kv") -> str:
    """Programs (top) -> the logical blocks they read (middle, the block table) -> physical blocks (bottom).
    `num_splits` programs per KV head are in the grid; those past the end of the context have no split."""
    if len(block_table) * block_size < seq_len:
        raise ValueError(f"a block table of {len(block_table)} blocks cannot hold {seq_len} tokens")
    dot = Dot(name, rankdir="TB", nodesep="0.1", ranksep="0.5")
    ranges = split_ranges(seq_len, num_splits, block_n)
    owner = {}  # logical block -> split that reads it
    for s, (start, end) in enumerate(ranges):
        color = SPLIT_COLORS[s % len(SPLIT_COLORS)]
        if end == start:
            dot.node(f"split{s}", f"program {s}\npast the end: returns", fillcolor="#eeeeee")
            continue
        dot.node(f"split{s}", f"program {s}: split {s}\ntokens {start}..{end - 1}", fillcolor=color)
        for blk in range(start // block_size, cdiv(end, block_size)):
            owner[blk] = s
    programs = " ".join(f'"split{s}";' for s in range(num_splits))
    dot.raw("{ rank=same; " + programs + " }")  # programs left to right in their order
    dot.raw(" -> ".join(f'"split{s}"' for s in range(num_splits)) + " [style=invis];")
    cells = "|".join(f"<l{i}> {i}: {b}" for i, b in enumerate(block_table))
    dot.raw(f'"table" [shape=record, style="filled", fillcolor="#e8f0fe", label="block table (logical: '
            f'physical)|{cells}"];')
    for blk, s in sorted(owner.items()):
        dot.raw(f'"split{s}" -> "table":l{blk};')
    for b in range(num_blocks):
        s = next((owner[i] for i, p in enumerate(block_table) if p == b and i in owner), None)
        dot.node(f"blk{b}", f"block {b}", fillcolor="#cccccc" if s is None else SPLIT_COLORS[s % len(SPLIT_COLORS)])
    for i, b in enumerate(block_table):
        dot.raw(f'"table":l{i} -> "blk{b}";')
    dot.raw("{ rank=same; " + " ".join(f'"blk{b}";' for b in range(num_blocks)) + " }")
    dot.raw(" -> ".join(f'"blk{b}"' for b in range(num_blocks)) + " [style=invis];")
    dot.node("merge", "merge kernel: lse = log sum_s exp(lse_s)\noutput = sum_s exp(lse_s - lse) * o_s",
             fillcolor="#ffffff")
    for s, (start, end) in enumerate(ranges):
        if end > start:  # one label says it for every dashed edge
            dot.edge(f"split{s}", "merge", "o_s, lse_s" if s == 0 else None, style="dashed")
    return dot.source()


def lesson_figures() -> dict[str, str]:
    """The README's example: 70 tokens in blocks of 16 scattered over a 10-block pool, a grid of 4 programs per
    KV head and 32-token tiles: three splits of one tile, and the fourth program returns at once."""
    return {"split_kv": split_kv_dot([7, 2, 9, 0, 5], seq_len=70, block_size=16, num_splits=4, block_n=32,
                                     num_blocks=10)}


if __name__ == "__main__":  # the chapter's figures alone: `python -m course figures` draws every chapter's
    from course.figures import main

    sys.exit(main([__package__]))
