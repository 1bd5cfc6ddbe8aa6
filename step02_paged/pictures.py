"""Pictures of chapter 2's structures: block tables pointing into the pool (DOT) and a one-line pool map."""
from __future__ import annotations

from course.draw import Dot

from .kv_cache_manager import KVCacheManager


def occupancy_map(kv: KVCacheManager) -> str:
    """One character per pool block: the holding sequence's id (mod 36), '*' if shared, '.' if free."""
    owners: dict[int, set[int]] = {}
    for seq in kv.holders.values():
        for b in seq.block_table:
            owners.setdefault(b, set()).add(seq.seq_id)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    return "".join("." if b not in owners else "*" if len(owners[b]) > 1 else digits[min(owners[b]) % 36]
                   for b in range(kv.num_blocks))


def block_tables_dot(kv: KVCacheManager, name: str = "paged", row: int = 16) -> str:
    """Block tables (one record per sequence, on top) pointing at the pool's blocks (below, in id order, `row`
    per line) with their ref counts: green held once, yellow shared, grey free."""
    dot = Dot(name, rankdir="TB", nodesep="0.08", ranksep="0.6")
    bm = kv.block_manager
    for seq in sorted(kv.holders.values(), key=lambda s: s.seq_id):
        cells = "|".join(f"<b{i}> {b}" for i, b in enumerate(seq.block_table)) or "(none)"
        dot.raw(f'"seq{seq.seq_id}" [shape=record, style="filled", fillcolor="#e8f0fe", '
                f'label="seq {seq.seq_id}\\n{seq.num_computed_tokens}/{seq.num_tokens} tok|{cells}"];')
        for i, b in enumerate(seq.block_table):
            dot.raw(f'"seq{seq.seq_id}":b{i} -> "blk{b}";')
    for b in range(kv.num_blocks):
        ref = bm.ref_count[b]
        color = "#cccccc" if ref == 0 else ("#fde293" if ref > 1 else "#ceead6")
        dot.node(f"blk{b}", f"block {b}\nref {ref}", fillcolor=color)
    for start in range(0, kv.num_blocks, row):  # the pool as rows of blocks, kept in id order
        ids = range(start, min(start + row, kv.num_blocks))
        dot.raw("{ rank=same; " + " ".join(f'"blk{b}";' for b in ids) + " }")
        dot.raw(" -> ".join(f'"blk{b}"' for b in ids) + " [style=invis];")
        if start + row < kv.num_blocks:
            dot.raw(f'"blk{start}" -> "blk{start + row}" [style=invis];')
    return dot.source()
