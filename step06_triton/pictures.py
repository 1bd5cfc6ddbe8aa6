"""Pictures of chapter 6 (DOT source; `python -m course figures` writes figures/*.{dot,svg}).

`split_kv_dot` draws one sequence's split-KV decode: which program (one per KV head and split) walks which
tiles of the context, and where each tile's tokens live in the pool through the block table. `cascade_dot` draws
a decode step with cascade attention from a cache's real state: the tree nodes that running requests share, the
prefix pass that reads each shared node's blocks once for all of them, each request's suffix pass, and the merge.
`fp8_block_dot` draws the bytes of one block in bf16 and in the FP8 pool (one byte per element and a scale per token
and head beside them), one layer of it to scale.
"""
from __future__ import annotations

import torch

from course.draw import Dot, word_ids, words
from step01_kvcache.config import ModelConfig
from step01_kvcache.request import SamplingParams
from step01_kvcache.tiny import SMOLLM2_135M, tiny_config
from step02_paged.cache_manager import CacheManager
from step02_paged.geometry import PoolGeometry, cdiv
from step02_paged.pictures import CHATS, SYSTEM, run_step
from step02_paged.sequence import Sequence
from step05_bridge import BridgeKVCacheManager

from .cascade import CascadeGroup, CascadeMetadata
from .fp8_pool import FP8_MAX, KVScales, make_kv_pool

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


def cascade_scenario() -> tuple[BridgeKVCacheManager, list[Sequence]]:
    """Chapter 2's three chats on the bridge (4-token blocks), each asked twice: with the system prompt and
    without (`<s> user What is ...`), all prefilled and decoding. Two prompts, so two groups share two prefixes."""
    kv = BridgeKVCacheManager(PoolGeometry(24, 4))
    seqs = []
    for i, (question, _) in enumerate(CHATS * 2):
        system = SYSTEM if i < len(CHATS) else "<s>"
        seqs.append(kv.new_sequence(i, word_ids(f"{system} {question}"), SamplingParams(max_new_tokens=4)))
    for seq in seqs:
        run_step(kv, seq, word_ids("It")[0])  # the prefill, and the first token
    return kv, seqs


def cascade_dot(kv: CacheManager, seqs: list[Sequence], num_heads: int = 9, num_kv_heads: int = 3,
                head_dim: int = 64, name: str = "cascade") -> str:
    """One decode step of `seqs` with cascade attention (the heads of SmolLM2 by default): the groups the cache
    finds (`shared_prefixes`), the prefix pass's programs per group (tiles of its queries x splits of its prefix,
    each reading the group's shared blocks once), each row's suffix pass from where its group's prefix ends, and
    the merge of every row's parts."""
    shared = kv.shared_prefixes(seqs)
    groups = [CascadeGroup(tuple(seqs.index(s) for s in p.seqs), p.num_blocks * kv.block_size) for p in shared]
    lens = [s.num_tokens for s in seqs]  # each row's context once its new token is stored
    md = CascadeMetadata.build(groups, lens, num_heads, num_kv_heads, head_dim, "cpu", num_sms=1)
    dot = Dot(name, rankdir="LR", nodesep="0.15", ranksep="0.5")
    dot.node("step", f"decode step: {len(seqs)} rows, {num_heads} query heads over {num_kv_heads} KV heads",
             shape="plaintext", fillcolor="white")
    tree = getattr(kv, "tree", None)
    for g, (grp, prefix) in enumerate(zip(groups, shared)):
        blocks = prefix.seqs[0].block_table[: prefix.num_blocks]
        text = words(prefix.seqs[0].all_token_ids[: grp.prefix_len])
        where = ""
        if tree is not None:  # the deepest node on every member's locked path
            common = set.intersection(*(set(tree.path(s.last_node)) for s in prefix.seqs))
            node = max(common, key=tree.depth)
            where = f"\ntree node #{node.id}: {tree.depth(node)} tokens, lock_ref {node.lock_ref}"
        dot.node(f"shared{g}", f"shared by rows {list(grp.rows)}\n\"{text}\"\nblocks {blocks}{where}",
                 fillcolor="#fde293")
        tiles = cdiv(len(grp.rows) * (num_heads // num_kv_heads), md.block_m)
        splits = int(md.group_splits[g])
        dot.node(f"prefix{g}", f"prefix pass, group {g}: {num_kv_heads} KV heads x {tiles} tile(s) of "
                 f"{len(grp.rows)} rows x {num_heads // num_kv_heads} heads x {splits} split(s)\n"
                 f"tokens 0..{grp.prefix_len - 1}, read once", fillcolor="#d2e3fc")
        dot.edge(f"shared{g}", f"prefix{g}", "K/V once")
    grouped = {r: g for g, grp in enumerate(groups) for r in grp.rows}
    for r, seq in enumerate(seqs):
        start, own = int(md.kv_start[r]), seq.block_table[int(md.kv_start[r]) // kv.block_size:]
        dot.node(f"suffix{r}", f"row {r} (seq {seq.seq_id}): suffix pass\ntokens {start}..{lens[r] - 1}, blocks "
                 f"{own}", fillcolor="#ceead6")
        dot.node(f"merge{r}", f"row {r}: merge by log-sum-exp" if r in grouped else f"row {r}: as plain decode",
                 fillcolor="white")
        dot.edge(f"suffix{r}", f"merge{r}")
        if r in grouped:
            dot.edge(f"prefix{grouped[r]}", f"merge{r}", "o, lse", style="dashed")
    return dot.source()


def _bar(cells: list[tuple[str, int, str]], points_per_byte: float, width: int) -> str:
    """A row of an HTML-like table holding one bar `width` points wide: (label, bytes, colour) cells, each as wide as
    its bytes, then blank."""
    widths = [max(8, round(n * points_per_byte)) for _, n, _ in cells]
    tds = "".join(f'<TD WIDTH="{w}" FIXEDSIZE="TRUE" HEIGHT="22" BGCOLOR="{color}"><FONT POINT-SIZE="9">{label}'
                  "</FONT></TD>" for w, (label, _, color) in zip(widths, cells))
    if width > sum(widths):
        tds += f'<TD WIDTH="{width - sum(widths)}" FIXEDSIZE="TRUE" HEIGHT="22" BORDER="0"> </TD>'
    return (f'<TR><TD BORDER="0"><TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="0">'
            f"<TR>{tds}</TR></TABLE></TD></TR>")


def fp8_block_dot(cfg: ModelConfig | None = None, block_size: int = 16, name: str = "fp8_block") -> str:
    """One block of the pool in bf16 and in fp8 with a scale per token and head (sizes from chapter 2's pools'
    `bytes_per_block`; SmolLM2's shape by default): one layer's K and V to scale, one token's head row, the block."""
    cfg = cfg or tiny_config(**SMOLLM2_135M)
    geo = PoolGeometry(1, block_size)
    bf16 = make_kv_pool(cfg, geo, "auto", torch.bfloat16, "meta").bytes_per_block
    fp8 = make_kv_pool(cfg, geo, "fp8_e4m3", torch.bfloat16, "meta").bytes_per_block
    static = make_kv_pool(cfg, geo, "fp8_e4m3", torch.bfloat16, "meta",  # a few scales per layer, none per block
                          KVScales.uniform(cfg.num_layers)).bytes_per_block
    h, d = cfg.num_kv_heads, cfg.head_dim
    rows = block_size * h  # head rows of one layer's K (and of its V)
    k16, k8, ks = rows * d * 2, rows * d, rows * 4  # bytes of one layer's K in bf16, in fp8, of its fp32 scales
    per_byte = 300 / k16  # one layer's K in bf16 is 300 points wide
    title = lambda text: f'<TR><TD BORDER="0" ALIGN="LEFT">{text}</TD></TR>'  # noqa: E731
    table = ('<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2" CELLPADDING="2">'
             + title(f"<B>bf16</B>: one layer of a {block_size}-token block ({block_size} tokens x {h} KV heads x "
                     f"{d}), K and V to scale")
             + _bar([(f"K {k16:,} B", k16, "#d2e3fc"), (f"V {k16:,} B", k16, "#ceead6")], per_byte, 600)
             + title(f"<B>fp8 e4m3</B>: one byte per element, and an fp32 scale s per token and head ({ks} B "
                     "per layer for K, as many for V)")
             + _bar([(f"K {k8:,} B", k8, "#d2e3fc"), ("s", ks, "#fde293"), (f"V {k8:,} B", k8, "#ceead6"),
                     ("s", ks, "#fde293")], per_byte, 600)
             + "</TABLE>>")
    dot = Dot(name, rankdir="TB", nodesep="0.2", ranksep="0.25")
    dot.raw(f'"layer" [shape=plaintext, style="", label={table}];')
    dot.node("row", f"one token's row of one head: {d} values x 2 B = {2 * d} B in bf16; in fp8 {d} bytes + its "
             f"scale = {d + 4} B\ns = max|x| / {FP8_MAX:g};  stored q = e4m3(x / s);  read back x = s * q\n"
             "the row's largest value is stored as 448 exactly, every other normal value to within 1/16 of itself",
             fillcolor="#fff8e1")
    dot.node("block", f"the whole block, {cfg.num_layers} layers of K and V: bf16 {bf16:,} B, fp8 with scales per "
             f"token and head {fp8:,} B\n{bf16 / fp8:.2f}x the blocks in the same bytes ({bf16 / static:.0f}x with "
             f"static scales: {static:,} B)", fillcolor="white")
    dot.edge("layer", "row", style="invis")
    dot.edge("row", "block", style="invis")
    return dot.source()


def lesson_figures() -> dict[str, str]:
    """The README's example: 70 tokens in blocks of 16 scattered over a 10-block pool, a grid of 4 programs per
    KV head and 32-token tiles: three splits of one tile, and the fourth program returns at once."""
    return {"split_kv": split_kv_dot([7, 2, 9, 0, 5], seq_len=70, block_size=16, num_splits=4, block_n=32,
                                     num_blocks=10),
            "cascade": cascade_dot(*cascade_scenario()),
            "fp8_block": fp8_block_dot()}
