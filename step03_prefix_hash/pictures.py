"""Pictures of chapter 3's cache: the tree that chained block hashes form without ever storing it (DOT and
text), each cached block with its ref count and LRU position, and the LRU free queue."""
from __future__ import annotations

from collections.abc import Callable

from course.draw import Dot, words
from step02_paged.cache_manager import CacheManager
from step02_paged.geometry import PoolGeometry
from step02_paged.pictures import chat, side_by_side

from .block_hash import NONE_HASH, BlockHash, short_hash
from .kv_cache_manager import PrefixCachingKVCacheManager

Decode = Callable[[list[int]], str]


def _children(kv: PrefixCachingKVCacheManager) -> dict[BlockHash | None, list[int]]:
    """Cached blocks by parent hash: the tree that chained hashes form without ever storing it."""
    children: dict[BlockHash | None, list[int]] = {}
    for b, entry in enumerate(kv.block_manager.entries):
        if entry is not None:
            children.setdefault(entry.parent, []).append(b)
    return children


def _nth(position: int) -> str:
    """A place in the free queue, counted from 1 as people count: the queue's head (position 0) goes 1st."""
    n = position + 1
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _describe(kv: PrefixCachingKVCacheManager, b: int, lru: dict[int, int], decode: Decode | None,
              width: int) -> list[str]:
    bm = kv.block_manager
    entry, ref = bm.entries[b], bm.ref_count[b]
    lines = [f"block {b}  #{short_hash(entry.block_hash)}",
             f"ref {ref}" + (f", evicted {_nth(lru[b])}" if ref == 0 else "")]
    if decode is not None:
        lines.append(_snippet(decode(list(entry.token_ids)), width))
    return lines


def hash_tree_dot(kv: PrefixCachingKVCacheManager, name: str = "prefix_cache", decode: Decode | None = None,
                  width: int = 22) -> str:
    """The implicit tree: a node per cached block with its ref count (and LRU position when free), an edge
    from its parent; each running sequence points at its deepest cached block; the LRU free queue below."""
    bm = kv.block_manager
    lru = {b: i for i, b in enumerate(bm.free_blocks)}
    cached_free = [b for b in bm.free_blocks if bm.entries[b] is not None]
    dot = Dot(name, rankdir="LR", nodesep="0.12", ranksep="0.35")
    dot.node("root", f"root\nNONE_HASH\n#{short_hash(NONE_HASH)}\n", shape="ellipse", fillcolor="#ffffff")
    for b, entry in enumerate(bm.entries):
        if entry is None:
            continue
        ref = bm.ref_count[b]
        color = "#e8eaed" if ref == 0 else ("#fde293" if ref > 1 else "#ceead6")
        first_out = bool(cached_free) and b == cached_free[0]
        dot.node(f"b{b}", "\n".join(_describe(kv, b, lru, decode, width)) + "\n", fillcolor=color,
                 color="#d93025" if first_out else None, penwidth=2 if first_out else None)
    gone: set[BlockHash] = set()
    for b, entry in enumerate(bm.entries):
        if entry is None:
            continue
        if entry.parent is None:
            dot.edge("root", f"b{b}")
        elif entry.parent in bm.cached:
            dot.edge(f"b{bm.cached[entry.parent]}", f"b{b}")
        else:  # its parent was evicted: unreachable (lookups stop at the first miss) until evicted too
            if entry.parent not in gone:
                gone.add(entry.parent)
                dot.node(f"gone{short_hash(entry.parent)}", f"evicted\n#{short_hash(entry.parent)}\n",
                         style="dashed")
            dot.edge(f"gone{short_hash(entry.parent)}", f"b{b}", style="dashed")
    for seq in sorted(kv.holders.values(), key=lambda s: s.seq_id):
        deepest = next((b for b in reversed(seq.block_table) if bm.entries[b] is not None), None)
        dot.node(f"seq{seq.seq_id}", f"seq {seq.seq_id}\n{seq.num_computed_tokens}/{seq.num_tokens} tok\n",
                 shape="box", fillcolor="#e8f0fe")
        if deepest is not None:
            dot.edge(f"seq{seq.seq_id}", f"b{deepest}", style="dashed", constraint="false")
    queue = list(bm.free_blocks)
    shown = "|".join(str(b) + ("*" if bm.entries[b] is not None else "") for b in queue[:24])
    more = f"|+{len(queue) - 24}" if len(queue) > 24 else ""
    dot.raw(f'"lru" [shape=record, style="filled", fillcolor="#f1f3f4", '
            f'label="{{LRU free queue\\n(evict first, * = cached)|{shown or "empty"}{more}}}"];')
    return dot.source()


def hash_tree_text(kv: PrefixCachingKVCacheManager, decode: Decode | None = None, width: int = 48) -> str:
    """The same tree as text, with each run of single-child blocks on one line (what a radix tree, in
    chapter 4, stores as one edge)."""
    bm = kv.block_manager
    children = _children(kv)
    lru = {b: i for i, b in enumerate(bm.free_blocks)}
    lines = [f"root  ({bm.num_cached} cached blocks, {len(bm.free_blocks)} free of {bm.num_blocks}, "
             f"{bm.num_evicted} evicted so far)"]

    def render(b: int, indent: str, last: bool, note: str = "") -> None:
        chain = [b]
        while len(kids := children.get(bm.entries[chain[-1]].block_hash, [])) == 1:
            chain.append(kids[0])
        refs = [bm.ref_count[c] for c in chain]
        state = f"ref {min(refs)}" if min(refs) == max(refs) else f"ref {max(refs)}..{min(refs)}"
        if max(refs) == 0:
            spots = sorted(lru[c] for c in chain)
            state += f", free (evicted {_nth(spots[0])}" + (f"..{_nth(spots[-1])})" if len(spots) > 1 else ")")
        text = ""
        if decode is not None:
            text = "  " + _snippet(decode([t for c in chain for t in bm.entries[c].token_ids]), width)
        name = f"block {b}" if len(chain) == 1 else f"blocks {_ranges(chain)}"
        lines.append(f"{indent}{'└─ ' if last else '├─ '}{note}{name}  [{len(chain) * kv.block_size} tok, "
                     f"#{short_hash(bm.entries[chain[-1]].block_hash)}, {state}]{text}")
        kids = children.get(bm.entries[chain[-1]].block_hash, [])
        for i, k in enumerate(kids):
            render(k, indent + ("   " if last else "│  "), i == len(kids) - 1)

    orphans = sorted(b for p, bs in children.items() if p is not None and p not in bm.cached for b in bs)
    tops = [(b, "") for b in children.get(None, [])] + [(b, "(parent evicted) ") for b in orphans]
    for i, (b, note) in enumerate(tops):
        render(b, "", i == len(tops) - 1, note)
    return "\n".join(lines)


def _snippet(text: str, width: int) -> str:
    """Both ends of a block run's text: the start says where it hangs, the end what makes it differ."""
    flat = text.replace("\n", "⏎")
    if len(flat) > width:
        flat = flat[: width // 2 - 1] + "…" + flat[-(width - width // 2):]
    return repr(flat)


def _ranges(ids: list[int]) -> str:
    """[3, 4, 5, 9, 11, 12] -> '3-5, 9, 11-12': long chains stay one short line."""
    out, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            out.append(str(ids[start]) if i - 1 == start else f"{ids[start]}-{ids[i - 1]}")
            start = i
    return ", ".join(out)


def three_chats(kv: CacheManager) -> None:
    """The scenario of this chapter's figure (and chapter 5's): request 0 runs to its end and frees its blocks;
    then requests 1 and 2, with the same system prompt, are admitted and decode side by side."""
    side_by_side(kv, [chat(kv, 0)])
    side_by_side(kv, [chat(kv, 1), chat(kv, 2)], steps=2)


def lesson_figures() -> dict[str, str]:
    """Three chats with one system prompt, 4-token blocks, a 10-block pool. Request 0's blocks stay cached in
    the free queue, tail first; requests 1 and 2 hit the system prompt's two blocks (ref 2)."""
    kv = PrefixCachingKVCacheManager(PoolGeometry(10, 4))
    three_chats(kv)
    return {"hash_chain": hash_tree_dot(kv, name="hash_chain", decode=words)}
