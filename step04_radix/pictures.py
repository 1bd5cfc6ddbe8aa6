"""Pictures of chapter 4's structures: the radix tree (text and DOT: edges with their tokens, nodes with their
slots, lock_ref and last access), the cache manager (the tree plus the requests that lock it, and a one-line
map of who owns each slot), and the waiting queue beside the tree (what a cache-aware policy sees)."""
from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence

from course.draw import Dot, word_ids, words
from step01_kvcache.request import SamplingParams
from step02_paged.geometry import PoolGeometry
from step02_paged.pictures import SYSTEM, chat, side_by_side
from step02_paged.sequence import Sequence as Request

from .policy import LongestPrefixMatch
from .radix_cache import RadixKVCacheManager
from .radix_tree import RadixTree, TreeNode

Decode = Callable[[list[int]], str]


def slot_ranges(slots: Sequence[int], max_runs: int = 3) -> str:
    """[0, 1, 2, 7, 8] -> '0-2,7-8': runs of consecutive slots, the first few of them ('none' for [])."""
    if not slots:
        return "none"
    runs: list[list[int]] = []
    for s in slots:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    text = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:max_runs])
    return text + (f",+{len(runs) - max_runs} runs" if len(runs) > max_runs else "")


def edge_text(node: TreeNode, decode: Decode | None = None, width: int = 36) -> str:
    """A short readable form of an edge: decoded text (newlines shown as ⏎) or the first token ids."""
    if decode is None:
        head = ", ".join(map(str, node.key[:6]))
        return f"[{head}{', ...' if len(node.key) > 6 else ''}]"
    return shorten(decode(node.key), width)


def shorten(text: str, width: int = 36) -> str:
    """`text` on one line (newlines shown as ⏎), its middle cut out if it is longer than about `width`."""
    text = text.replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 14] + " … " + text[-11:]


def _evictable(node: TreeNode) -> bool:
    return node.lock_ref == 0 and not node.children


def tree_text(tree: RadixTree, decode: Decode | None = None, width: int = 48, values: str = "slots") -> str:
    """The tree as indented text: edge, size, value ranges (`values` names them), lock_ref, last access."""
    lines = [f"root  ({tree.num_tokens} tokens cached in {tree.total_size} {values}: {tree.protected_size} locked, "
             f"{tree.evictable_size} evictable)"]

    def walk(node: TreeNode, indent: str) -> None:
        kids = [node.children[t] for t in sorted(node.children)]
        for i, child in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(f"{indent}{'└─ ' if last else '├─ '}{edge_text(child, decode, width)}  "
                         f"{len(child.key)} tok, {values} {slot_ranges(child.value)}, lock_ref {child.lock_ref}, "
                         f"t={child.last_access}{'  [evictable]' if _evictable(child) else ''}")
            walk(child, indent + ("   " if last else "│  "))

    walk(tree.root, "")
    return "\n".join(lines)


def draw_tree(dot: Dot, tree: RadixTree, decode: Decode | None = None, values: str = "slots",
              prefix: str = "n") -> None:
    """Add the tree's nodes and edges to `dot` (node names `<prefix><id>`; the root is `n0`). Locked nodes are blue,
    evictable leaves yellow with a thick border."""
    n = prefix
    dot.node(f"{n}{tree.root.id}", f"root\n{tree.num_tokens} tok cached", shape="ellipse", fillcolor="#eeeeee")
    for node in tree.nodes():
        evictable = _evictable(node)
        color = "#c6dafc" if node.lock_ref else "#fde293" if evictable else "white"
        label = (f"{len(node.key)} tok · {values} {slot_ranges(node.value)}\n"
                 f"lock_ref {node.lock_ref} · t={node.last_access}" + ("\nevictable" if evictable else ""))
        dot.node(f"{n}{node.id}", label, fillcolor=color, penwidth="2" if evictable else None)
        dot.edge(f"{n}{node.parent.id}", f"{n}{node.id}", edge_text(node, decode))


def tree_dot(tree: RadixTree, decode: Decode | None = None, name: str = "radix") -> str:
    """Deterministic DOT: edges carry their (decoded) tokens; nodes their slots, lock_ref and last access."""
    dot = Dot(name, rankdir="LR", nodesep="0.2", ranksep="0.3")
    draw_tree(dot, tree, decode)
    return dot.source()


def cache_text(kv: RadixKVCacheManager, decode: Decode | None = None) -> str:
    """The tree as indented text, then one line per live request: the node it locks and what it holds."""
    lines = [tree_text(kv.tree, decode)]
    lines += [f"seq {seq.seq_id}: locks node #{seq.last_node.id} ({seq.cache_protected_len} tokens in the tree), "
              f"{len(kv.private_blocks(seq))} private slots"
              for seq in sorted(kv.holders.values(), key=lambda s: s.seq_id)]
    return "\n".join(lines)


def cache_dot(kv: RadixKVCacheManager, decode: Decode | None = None, name: str = "radix_cache") -> str:
    """The tree, plus one box per live request pointing at the node it locks."""
    dot = Dot(name, rankdir="LR", nodesep="0.2", ranksep="0.3")
    draw_tree(dot, kv.tree, decode)
    for seq in sorted(kv.holders.values(), key=lambda s: s.seq_id):
        dot.node(f"seq{seq.seq_id}", f"seq {seq.seq_id}\n{seq.cache_protected_len} tok in tree, "
                 f"{len(kv.private_blocks(seq))} private", shape="note", fillcolor="#e8f0fe")
        dot.edge(f"seq{seq.seq_id}", f"n{seq.last_node.id}", "last_node", style="dashed", color="#1a73e8")
    return dot.source()


def occupancy_map(kv: RadixKVCacheManager) -> str:
    """One character per slot: a request's id (mod 36) for its private slots, '*' for locked tree slots,
    '-' for evictable cached slots, '.' for free ones."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    cells = ["."] * kv.num_blocks
    for node in kv.tree.nodes():
        for s in node.value:
            cells[s] = "*" if node.lock_ref else "-"
    for seq in kv.holders.values():
        for s in kv.private_blocks(seq):
            cells[s] = digits[seq.seq_id % 36]
    return "".join(cells)


def record_field(text: str) -> str:
    """Text safe in a field of a DOT record label (its braces, bars, angle brackets and quotes escaped)."""
    return re.sub(r'([{}|<>"\\])', r"\\\1", text)


def queue_text(kv: RadixKVCacheManager, waiting: deque[Request], decode: Decode | None = None, width: int = 56) -> str:
    """The waiting queue, front first: each request's cached prefix (looked up as a policy does) and how its prompt
    ends."""
    lines = []
    for i, seq in enumerate(waiting):
        cached = kv.get_computed_blocks(seq).num_tokens
        text = (decode(seq.prompt_ids) if decode else str(seq.prompt_ids)).replace("\n", "⏎")
        lines.append(f"{i + 1:>3}. seq {seq.seq_id}: {cached:>4} of {seq.num_prompt_tokens:>4} prompt tokens cached  "
                     f"{text if len(text) <= width else '… ' + text[-width:]}")
    return "\n".join(lines)


def queue_dot(kv: RadixKVCacheManager, waiting: deque[Request], decode: Decode | None = None,
              name: str = "waiting_queue", title: str = "waiting queue, front first") -> str:
    """The tree, and beside it the waiting queue, front first: each request says how much of its prompt is cached
    and points (dashed) at the node where that prefix ends. The requests are looked up as a policy looks them up:
    a lookup may split an edge and touches the clocks along its path."""
    matches = [kv.get_computed_blocks(seq) for seq in waiting]  # first: a lookup may split an edge
    dot = Dot(name, rankdir="LR", nodesep="0.2", ranksep="0.4")
    draw_tree(dot, kv.tree, decode)
    fields, pointers = [record_field(title)], []
    for i, (seq, match) in enumerate(zip(waiting, matches)):
        rest = seq.prompt_ids[match.num_tokens:]
        tail = shorten(decode(rest) if decode else ", ".join(map(str, rest)), 40)
        fields.append(f"<q{i}> " + record_field(f"{i + 1}. seq {seq.seq_id}: {match.num_tokens} of "
                                                f"{seq.num_prompt_tokens} cached, computes '{tail}'"))
        pointers.append(f'"queue":q{i} -> "n{match.node.id}" [style="dashed", color="#1a73e8", arrowsize="0.6"];')
    label = "|".join(fields)
    dot.raw(f'"queue" [shape=record, style="filled", fillcolor="#e8f0fe", label="{label}"];')
    for line in pointers:
        dot.raw(line)
    return dot.source()


# The queue of `lpm_before` / `lpm_after`: what each request asks, after the tree cached request 0's chat.
WAITING = ("<s> user What is 3+3 ?", f"{SYSTEM} user What is 5+5 ?",
           f"{SYSTEM} user What is 2+2 ? It is 4 . user What is 3+3 ?", "<s> system You are a assistant . user "
           "What is 5+5 ?")


def lesson_figures() -> dict[str, str]:
    """A split, before and after, in a 40-slot pool. Request 0 is decoding: its prompt is one edge, locked
    (lock_ref 1). Request 1 shares the system prompt and "user What is": its match ends inside that edge, which
    is split there; the upper node copies lock_ref 1 and request 1's lock makes it 2."""
    kv = RadixKVCacheManager(PoolGeometry(40, 1))
    side_by_side(kv, [chat(kv, 0)], steps=2)
    before = cache_dot(kv, words, name="split_before")
    side_by_side(kv, [chat(kv, 1)], steps=1)
    figures = {"split_before": before, "split_after": cache_dot(kv, words, name="split_after")}
    return figures | lpm_figures()


def lpm_figures() -> dict[str, str]:
    """The waiting queue before and after `lpm` orders it. Request 0's chat is cached (finished); four requests
    wait, in arrival order: one shares only "<s>", one the system prompt and "user What is", one is request 0's
    chat continued (a follow-up turn: everything cached but its new question), one leaves the system prompt after
    "You are a". `lpm` puts them in the order of what they find cached: 16, 11, 5, 1 tokens."""
    kv = RadixKVCacheManager(PoolGeometry(64, 1))
    side_by_side(kv, [chat(kv, 0)])
    params = SamplingParams(max_new_tokens=1)
    waiting = deque(kv.new_sequence(i, word_ids(text), params) for i, text in enumerate(WAITING, 1))
    before = queue_dot(kv, waiting, words, name="lpm_before", title="before: arrival order")
    LongestPrefixMatch().order(waiting, kv, seats=2)
    return {"lpm_before": before, "lpm_after": queue_dot(kv, waiting, words, name="lpm_after",
                                                         title="after lpm: longest cached prefix first")}
