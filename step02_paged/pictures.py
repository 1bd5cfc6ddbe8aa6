"""Pictures of chapter 2's structures: block tables pointing into the pool (DOT) and a one-line pool map.

The lesson figures of chapters 2-5 drive their cache managers with the same requests (`chat`) through
`run_step`, which does to a sequence's memory what one engine step does, without a model.
"""
from __future__ import annotations

from course.draw import Dot, word_ids
from step01_kvcache.request import SamplingParams

from .cache_manager import CacheManager
from .geometry import PoolGeometry
from .kv_cache_manager import KVCacheManager
from .scheduler import admit
from .sequence import Sequence

# The lesson figures' requests: a system prompt of two 4-token blocks, then a question; `answer` stands in
# for what a model would sample.
SYSTEM = "<s> system You are a helpful assistant ."
CHATS = (("user What is 2+2 ?", "It is 4 ."), ("user What is 3+3 ?", "It is 6 ."), ("user What is 5+5 ?", "It is 10 ."))


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


def chat(kv: CacheManager, i: int, system: bool = True,
         max_new_tokens: int | None = None) -> tuple[Sequence, list[int]]:
    """Request `i` of CHATS as `kv` tracks it (sequence id `i`), and its answer's token ids. By default it
    finishes with its answer; a larger `max_new_tokens` keeps it running."""
    question, answer = CHATS[i]
    prompt = word_ids(f"{SYSTEM if system else '<s>'} {question}")
    params = SamplingParams(max_new_tokens=max_new_tokens or len(answer.split()))
    return kv.new_sequence(i, prompt, params), word_ids(answer)


def run_step(kv: CacheManager, seq: Sequence, sampled: int) -> None:
    """One engine step of one sequence, without a model: on admission the cached prefix is looked up and
    shared; room is made for the pending tokens, which then count as computed (`on_computed` publishes
    them); `sampled` is appended as the model's choice, and a sequence that this finishes is freed."""
    match = None if seq.seq_id in kv.holders else kv.get_computed_blocks(seq)
    pending = seq.num_tokens - (match.num_tokens if match else seq.num_computed_tokens)
    if not kv.allocate_slots(seq, pending, match):
        raise RuntimeError(f"the pool is too small for sequence {seq.seq_id}'s {pending} tokens")
    if match is not None:
        admit(kv, seq, match)
    seq.advance(pending)
    kv.on_computed(seq)
    seq.append_token(sampled)
    if seq.is_finished:
        kv.free(seq)
    kv.check_invariants()


def side_by_side(kv: CacheManager, requests: list[tuple[Sequence, list[int]]], steps: int | None = None) -> None:
    """`steps` engine steps (default: to the end of the shortest answer) in which each request, a sequence and
    its answer as `chat` returns them, runs once, in order: its prefill first, then one decode per step."""
    for step in range(min(len(answer) for _, answer in requests) if steps is None else steps):
        for seq, answer in requests:
            run_step(kv, seq, answer[step])


def lesson_figures() -> dict[str, str]:
    """Two requests decode side by side in an 8-block pool of 4-token blocks. Each takes a block from the free
    list when its last one is full, so a block table lists whatever blocks were free at the time."""
    kv = KVCacheManager(PoolGeometry(8, 4))
    side_by_side(kv, [chat(kv, i, system=False, max_new_tokens=8) for i in (0, 1)])
    return {"block_tables": block_tables_dot(kv, name="block_tables", row=8)}
