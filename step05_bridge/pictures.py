"""Pictures of chapter 5's bridge: the three layers in one DOT picture (the tree, the requests that lock it,
the pool with every block's ref_count) and as text; and the mini-runtime textbook's tree, before and after the
split of its example, with the offsets drawn; and a speculative step whose rollback crosses a block boundary,
slot by slot."""
from __future__ import annotations

from html import escape

from course.draw import WORDS, Dot, esc, word_ids, words
from step01_kvcache.request import SamplingParams
from step02_paged.cache_manager import CacheManager
from step02_paged.geometry import PoolGeometry
from step02_paged.kv_cache_manager import KVCacheManager
from step02_paged.pictures import run_step
from step02_paged.sequence import Sequence
from step03_prefix_hash.pictures import three_chats
from step04_radix.pictures import Decode, draw_tree, tree_text

from .block_radix_tree import BlockRadixTree
from .bridge_cache import BridgeKVCacheManager
from .ngram_proposer import NgramProposer
from .offset_tree import OffsetRadixTree
from .rollback import release_rejected_blocks, rollback
from .verify import num_accepted


def bridge_text(kv: BridgeKVCacheManager, decode: Decode | None = None) -> str:
    """The tree as indented text (blocks on every edge), then one line per live request: the node it locks,
    its block table split into the tree's part and its own, and the blocks' ref_counts."""
    lines = [tree_text(kv.tree, decode, values="blocks")]
    for seq in sorted(kv.holders.values(), key=lambda s: s.seq_id):
        refs = [kv.block_manager.ref_count[b] for b in seq.block_table]
        shared = seq.cache_protected_len // kv.block_size
        lines.append(f"seq {seq.seq_id}: locks node #{seq.last_node.id} ({seq.cache_protected_len} tokens in the "
                     f"tree); block_table {seq.block_table[:shared]} from the tree + {seq.block_table[shared:]} its "
                     f"own; ref_counts {refs}")
    return "\n".join(lines)


def bridge_dot(kv: BridgeKVCacheManager, decode: Decode | None = None, name: str = "bridge", row: int = 16) -> str:
    """The three layers in one picture: the tree (edges with their tokens, nodes with their blocks and
    lock_ref), the live requests (pointing at the node they lock) and the pool, `row` blocks per line, each
    with its ref_count: grey free, white held by the tree alone, green by one request alone, yellow by
    two or more holders (the tree and a request, or several requests)."""
    dot = Dot(name, rankdir="LR", nodesep="0.15", ranksep="0.35")
    draw_tree(dot, kv.tree, decode, values="blocks")
    for seq in sorted(kv.holders.values(), key=lambda s: s.seq_id):
        dot.node(f"seq{seq.seq_id}", f"seq {seq.seq_id}\nblock_table {seq.block_table}",
                 shape="note", fillcolor="#e8f0fe")
        dot.edge(f"seq{seq.seq_id}", f"n{seq.last_node.id}", "last_node", style="dashed", color="#1a73e8")
    in_tree = set(kv.tree.all_blocks())
    colors = {"free": "#cccccc", "tree": "white", "one": "#ceead6", "shared": "#fde293"}
    cells = []
    for b in range(kv.num_blocks):
        r = kv.block_manager.ref_count[b]
        users = r - (b in in_tree)  # requests holding the block
        kind = "free" if r == 0 else "tree" if users == 0 else "one" if r == 1 else "shared"
        text = "free" if r == 0 else "tree" if users == 0 else f"ref {r}"
        cells.append(f'<TD PORT="b{b}" BGCOLOR="{colors[kind]}">{b}<BR/>{text}</TD>')
    table = "".join(f"<TR>{''.join(cells[i:i + row])}</TR>" for i in range(0, kv.num_blocks, row))
    dot.raw(f'"pool" [shape=plaintext, fontsize=9, label=<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0">'
            f'{table}</TABLE>>];')
    dot.raw('{ rank=max; "pool"; }')
    for node in kv.tree.nodes():
        for b in node.value:
            dot.raw(f'"n{node.id}" -> "pool":b{b} [style=dotted, color="#888888", arrowsize=0.5];')
    return dot.source()


def block_tree_dot(tree: BlockRadixTree, decode: Decode | None = None, name: str = "block_tree") -> str:
    """The block tree alone: edges with their tokens, nodes with the blocks they own, lock_ref, last access."""
    dot = Dot(name, rankdir="LR", nodesep="0.2", ranksep="0.3")
    draw_tree(dot, tree, decode, values="blocks")
    return dot.source()


def tier_dot(kv: BridgeKVCacheManager, decode: Decode | None = None, name: str = "host_tier") -> str:
    """The two tiers side by side: the device tree over the pool's blocks, and the host tier's tree over host
    blocks, where an evicted prefix waits to be loaded back (a prefix can be on both: the host keeps its copy)."""
    dot = Dot(name, rankdir="LR", nodesep="0.2", ranksep="0.3")
    host = kv.host.block_manager if kv.host else None
    for key, tree, what, free in (("d", kv.tree, "device pool", kv.block_manager.num_free),
                                  ("h", kv.host_tree, "host tier", host.num_free if host else kv.host_blocks)):
        total = kv.num_blocks if key == "d" else kv.host_blocks
        dot.raw(f'subgraph cluster_{key} {{ label="{what}: {total} blocks, {free} free"; fontname="Helvetica"; '
                'fontsize=10; style="rounded"; color="#888888";')
        draw_tree(dot, tree, decode, values="blocks" if key == "d" else "host blocks", prefix=key)
        dot.raw("}")
    return dot.source()


def tier_scenario() -> BridgeKVCacheManager:
    """Chapter 3's three chats on a device pool of 6 blocks over a host tier of 8: request 0 finishes, then
    requests 1 and 2 (another system prompt's users) need its blocks, and its prefix moves to the host tier."""
    from step01_kvcache.tiny import tiny_config
    from step02_paged.kv_pool import KVPool
    from step02_paged.pictures import chat, side_by_side

    geometry = PoolGeometry(6, 4)
    kv = BridgeKVCacheManager(geometry, KVPool(tiny_config(), geometry), host_blocks=8, min_load_tokens=4)
    side_by_side(kv, [chat(kv, 0)])
    side_by_side(kv, [chat(kv, 1, system=False), chat(kv, 2, system=False)], steps=2)
    return kv


def _tokens(tokens: list[int], decode: Decode | None, most: int = 4) -> str:
    """The first `most` tokens, decoded or as ids."""
    shown = decode(tokens[:most]) if decode else " ".join(map(str, tokens[:most]))
    return shown + (" …" if len(tokens) > most else "")


def draw_offset_tree(dot: Dot, tree: OffsetRadixTree, decode: Decode | None = None, prefix: str = "n") -> None:
    """Add the textbook's tree to `dot`: each node with the path positions its edge covers and its blocks, the dead
    slots at the head of a branch's first block in grey (its offset); each edge with its first tokens, a bar where
    the branch's own tokens start."""
    dot.node(f"{prefix}{tree.root.id}", "root", shape="ellipse", fillcolor="#eeeeee")
    for node in tree.nodes():
        start, end = tree.depth(node.parent), tree.depth(node)
        cells = "".join((f'<TD BGCOLOR="#cccccc">slots 0–{node.offset - 1}</TD>' if i == 0 and node.offset else "")
                        + f"<TD>{b}</TD>" for i, b in enumerate(node.value))
        note = f"offset {node.offset}: own tokens from {start + node.offset}" if node.offset else "offset 0"
        width = len(node.value) + (node.offset > 0)
        dot.raw(f'"{prefix}{node.id}" [shape=plaintext, style="", label=<<TABLE BORDER="0" CELLBORDER="1" '
                f'CELLSPACING="0"><TR><TD COLSPAN="{width}">positions {start}–{end - 1}</TD></TR><TR>{cells}</TR>'
                f'<TR><TD COLSPAN="{width}">{note}</TD></TR></TABLE>>];')
        key = [t for block in node.key for t in block]
        label = (f"{_tokens(key[: node.offset], decode)} | " if node.offset else "") + \
            _tokens(key[node.offset:], decode)
        dot.edge(f"{prefix}{node.parent.id}", f"{prefix}{node.id}", label)


def offset_split_dot(decode: Decode | None = None, name: str = "offset_split") -> str:
    """The mini-runtime textbook's example in its own numbers (block size 16): request 1, 48 tokens (ids 10..57) in
    blocks 100, 101, 102; request 2 shares its first 20 tokens and fills block 200. Before: one edge. After: the
    split falls at 16, the upper node keeps 100, both branches start at 16 with offset 4 (slots 0-3 of 101 and of
    200 hold the same four tokens, computed twice)."""
    first = list(range(10, 58))
    second = first[:20] + list(range(90, 102))
    before, after = OffsetRadixTree(16), OffsetRadixTree(16)
    for tree in (before, after):
        tree.insert(first, [100, 101, 102])
    after.insert(second, [100, 200])
    dot = Dot(name, rankdir="LR", nodesep="0.2", ranksep="0.3")
    for key, title, tree in (("a", "after: request 2 shares 20 tokens, the split falls at 16", after),
                             ("b", "before: request 1 cached", before)):  # graphviz stacks the later one on top
        dot.raw(f'subgraph cluster_{key} {{ label="{esc(title)}"; fontname="Helvetica"; fontsize=10; '
                'style="rounded"; color="#888888";')
        draw_offset_tree(dot, tree, decode, prefix=key)
        dot.raw("}")
    return dot.source()


def verify_step(kv: CacheManager, seq: Sequence, drafts: list[int], kept: list[int]) -> tuple[list[int], int]:
    """One speculative engine step of one decoding sequence, without a model: room for its pending token and
    `drafts`, which the forward computes; `kept` stands for what the model keeps (the drafts its samples agree with
    and one token more). The rejected drafts are rolled back (`rollback`, then `release_rejected_blocks` gives back
    the blocks only they used), the manager hears of the step, the kept tokens join the sequence. Returns the block
    table and the counter as the forward left them, before the rollback."""
    seq.spec_token_ids = list(drafts)
    n = seq.num_pending_tokens
    if not kv.allocate_slots(seq, n):
        raise RuntimeError(f"the pool is too small for sequence {seq.seq_id}'s {n} tokens")
    seq.advance(n)
    seq.spec_token_ids = []
    during = list(seq.block_table), seq.num_computed_tokens
    rejected = len(drafts) - num_accepted(kept, drafts)
    if rejected:
        rollback(seq, rejected)
        release_rejected_blocks(kv, seq)
    kv.on_computed(seq)
    for token in kept:
        seq.append_token(token)
    kv.check_invariants()
    return during


SLOT_COLORS = {"verified": "#ceead6", "draft": "#fde293", "rejected": "#f4c7c3", "empty": "#ffffff"}


def slots_panel(dot: Dot, name: str, title: str, table: list[int], cells: list[tuple[str, str]], block_size: int,
                freed: list[int] = ()) -> None:
    """One row of a block table drawn slot by slot: each block a box of `block_size` cells (`cells[i]` is position
    i's (text, kind), kinds as in SLOT_COLORS), and `freed` blocks greyed after it."""
    boxes = []
    for i, block in enumerate(list(table) + list(freed)):
        gone = i >= len(table)
        row = "".join(
            f'<TD BGCOLOR="{"#cccccc" if gone else SLOT_COLORS[kind]}">{escape(text) or "&nbsp;"}</TD>'
            for text, kind in (cells[p] if p < len(cells) else ("", "empty")
                               for p in range(i * block_size, (i + 1) * block_size)))
        head = f"block {block}" + (" (freed)" if gone else "")
        boxes.append(f'<TD><TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0"><TR><TD COLSPAN="{block_size}">{head}'
                     f"</TD></TR><TR>{row}</TR></TABLE></TD>")
    dot.raw(f'"{name}" [shape=plaintext, style="", label=<<TABLE BORDER="0" CELLSPACING="6"><TR>'
            f'<TD>{escape(title).replace(chr(10), "<BR/>")}</TD>{"".join(boxes)}</TR></TABLE>>];')


def rollback_figure() -> str:
    """A rollback across a block boundary, drawn from a KVCacheManager of 4-token blocks and the prompt-lookup
    proposer. The prompt asks two questions; after the model writes "It" for the second, lookup finds "? It" in the
    first answer and drafts what followed: "is 4 . What". The verify step writes the pending token and the four
    drafts (positions 13-17, into a fifth block). The model keeps "is" and writes "6" where the draft said "4":
    three drafts are rejected, the counter goes back to 15, and the fifth block, which held only rejected drafts,
    goes back to the free list; position 15 still holds the K/V of "4" until the next step writes "6" there."""
    kv = KVCacheManager(PoolGeometry(8, 4))
    seq = kv.new_sequence(0, word_ids("<s> What is 2+2 ? It is 4 . What is 3+3 ?"), SamplingParams(max_new_tokens=8))
    run_step(kv, seq, word_ids("It")[0])
    drafts = NgramProposer(min_n=2, max_n=4).propose(seq, 4)
    kept = word_ids("is 6")
    verified = [(WORDS[t], "verified") for t in seq.all_token_ids]
    table, computed = verify_step(kv, seq, drafts, kept)
    accepted = num_accepted(kept, drafts)
    during = verified + [(WORDS[t], "draft") for t in drafts]
    after = verified + [(WORDS[t], "verified") for t in drafts[:accepted]] + \
        [(WORDS[t], "rejected") for t in drafts[accepted:]]
    dot = Dot("rollback", rankdir="TB", nodesep="0.1", ranksep="0.25")
    slots_panel(dot, "during", f"the verify step's forward\n{computed} positions computed", table, during,
                kv.block_size)
    slots_panel(dot, "after", f"after the rollback\n{seq.num_computed_tokens} computed, "
                f"next: \"{WORDS[seq.output_ids[-1]]}\" at {seq.num_computed_tokens}", seq.block_table, after,
                kv.block_size, freed=table[len(seq.block_table):])
    dot.raw('"during" -> "after" [style=invis];')
    return dot.source()


def lesson_figures() -> dict[str, str]:
    """Chapter 3's scenario on the bridge: request 0 has finished (its blocks stay, held by the tree alone),
    requests 1 and 2 share the system prompt's blocks. Both counts show: the shared node has lock_ref 2, its
    blocks ref_count 3 (the tree and two requests). Then the host tier's scenario, and the mini-runtime textbook's
    split with its offsets; and the rollback of a speculative step."""
    kv = BridgeKVCacheManager(PoolGeometry(10, 4))
    three_chats(kv)
    return {"bridge": bridge_dot(kv, words, name="bridge"), "host_tier": tier_dot(tier_scenario(), words),
            "offset_split": offset_split_dot(), "rollback": rollback_figure()}
