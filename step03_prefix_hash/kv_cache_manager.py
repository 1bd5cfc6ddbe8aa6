"""PrefixCachingKVCacheManager: chapter 2's manager with vLLM v1's answers to its three questions.

- `get_computed_blocks`: walk the request's block hashes from the first; each one found in the map is a
  block whose K/V can be reused, and the walk stops at the first miss (a chain has no holes). At most
  `num_tokens - 1` tokens may hit: the last prompt token is always computed, because sampling needs its
  logits — a prompt found entirely in the cache still runs one token.
- `allocate_slots` (chapter 2's, unchanged): the hits are touched *before* any new block is allocated, so
  an allocation can never evict a block it is about to reuse; if the pool is too small nothing changes.
- `on_computed`: after every forward, publish the blocks that became full and computed — prompt blocks
  during prefill, and blocks filled by generated tokens during decode.
- `free` (chapter 2's): tail blocks are released first, so a request's last blocks are evicted before its
  first ones, which other requests are likelier to share.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from course.draw import Dot
from step02_paged.kv_cache_manager import KVCacheManager
from step02_paged.sequence import Sequence

from .block_hash import NONE_HASH, BlockHash, block_extra_keys, short_hash
from .block_manager import CacheEntry, PrefixCachingBlockManager
from .sequence import HashedSequence

Decode = Callable[[list[int]], str]


@dataclass
class PrefixCacheStats:
    """Counted once per request, at its first admission (a preempted request's recompute is not a query)."""

    requests: int = 0
    hit_requests: int = 0  # requests that reused at least one block (the seed's per-request hit)
    queried_tokens: int = 0  # prompt tokens looked up
    hit_tokens: int = 0  # of those, served from the cache
    recent: deque = field(default_factory=lambda: deque(maxlen=1000))  # (seq_id, prompt tokens, hit tokens)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class PrefixCachingKVCacheManager(KVCacheManager):
    block_manager: PrefixCachingBlockManager

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.enable_caching = enable_caching
        super().__init__(num_blocks, block_size)
        self.stats = PrefixCacheStats()
        self._num_published: dict[int, int] = {}  # seq_id -> blocks of its table already published

    def _make_block_manager(self, num_blocks: int) -> PrefixCachingBlockManager:
        return PrefixCachingBlockManager(num_blocks)

    def _caches(self, seq: Sequence) -> bool:
        if not (self.enable_caching and isinstance(seq, HashedSequence)):
            return False
        if seq.block_size != self.block_size:
            raise ValueError(f"sequence {seq.seq_id} hashes {seq.block_size}-token blocks but the pool's blocks "
                             f"hold {self.block_size} tokens")
        return True

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[int], int]:
        """The longest chain of cached blocks that starts the sequence, within its first num_tokens - 1
        tokens; and how many tokens they cover. Only full blocks are ever cached, so it is a multiple of
        the block size. Looks only: nothing is held until allocate_slots."""
        if not self._caches(seq):
            return [], 0
        # BEGIN SOLUTION task3.lookup
        max_blocks = (seq.num_tokens - 1) // self.block_size  # keep the last token: its logits are needed
        blocks = []
        for block_hash in seq.block_hashes[:max_blocks]:
            block = self.block_manager.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size
        # END SOLUTION

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] = (),
                       num_computed_tokens: int = 0) -> bool:
        """Chapter 2's (hits touched first, then new blocks; all or nothing), plus bookkeeping on admission:
        hits count as published, and the request's hit is recorded in `stats` once, at its first admission."""
        admitting, caching = not seq.block_table, self._caches(seq)
        cached_before = seq.num_cached_tokens
        if not super().allocate_slots(seq, num_new_tokens, computed_blocks, num_computed_tokens):
            return False
        if admitting:
            self._num_published[seq.seq_id] = len(computed_blocks)  # hits are published already
            if seq.num_preemptions:
                seq.num_cached_tokens = cached_before  # a recompute's hits are not prompt hits
            elif caching:
                hit = num_computed_tokens if computed_blocks else 0
                s = self.stats
                s.requests += 1
                s.hit_requests += hit > 0
                s.queried_tokens += seq.num_prompt_tokens
                s.hit_tokens += hit
                s.recent.append((seq.seq_id, seq.num_prompt_tokens, hit))
        return True

    def _share(self, blocks: list[int]) -> None:
        self.block_manager.touch(blocks)

    def on_computed(self, seq: Sequence) -> None:
        """Publish the sequence's blocks that are now full of computed tokens, in order."""
        if not self._caches(seq):
            return
        # BEGIN SOLUTION task3.publish
        bs = self.block_size
        done = self._num_published.get(seq.seq_id, 0)
        full = min(seq.num_computed_tokens // bs, len(seq.block_hashes))
        for i in range(done, full):
            entry = CacheEntry(seq.block_hashes[i], seq.block_hashes[i - 1] if i else None,
                               tuple(seq.token_slice(i * bs, (i + 1) * bs)), block_extra_keys(i, seq.cache_salt))
            self.block_manager.cache_block(seq.block_table[i], entry)
        self._num_published[seq.seq_id] = max(done, full)
        # END SOLUTION

    def free(self, seq: Sequence) -> None:
        super().free(seq)
        self._num_published.pop(seq.seq_id, None)

    def reset(self) -> int:
        """Drop every cached block; only when no request holds blocks (RuntimeError otherwise, nothing changed)."""
        if self.holders:
            raise RuntimeError(f"cannot reset the prefix cache while {len(self.holders)} requests hold blocks; "
                               "finish or abort them first")
        return self.block_manager.reset()

    def check_invariants(self) -> None:
        """Chapter 2's (ref counts = holders), the block manager's, and: a sequence's hashes are the chain of
        its tokens; a cached block in a block table sits where the sequence has exactly that content, and
        only once the sequence has computed it; published counts cover computed blocks only."""
        super().check_invariants()
        bs = self.block_size
        assert set(self._num_published) == set(self.holders), "published counts kept for sequences without blocks"
        for seq in self.holders.values():
            if not isinstance(seq, HashedSequence):
                continue
            seq.check_invariants()
            assert self._num_published[seq.seq_id] * bs <= seq.num_computed_tokens, \
                f"sequence {seq.seq_id}: a block was published before its K/V were computed"
            for i, b in enumerate(seq.block_table):
                entry = self.block_manager.entries[b]
                if entry is None:
                    continue
                assert i < len(seq.block_hashes) and entry.block_hash == seq.block_hashes[i], \
                    f"sequence {seq.seq_id} holds cached block {b} at position {i}, where its content differs"
                assert seq.num_computed_tokens >= (i + 1) * bs, \
                    f"sequence {seq.seq_id} holds cached block {b} at position {i} but has not computed it"

    # ---- pictures --------------------------------------------------------------------------------------
    def _children(self) -> dict[BlockHash | None, list[int]]:
        """Cached blocks by parent hash: the tree that chained hashes form without ever storing it."""
        children: dict[BlockHash | None, list[int]] = {}
        for b, entry in enumerate(self.block_manager.entries):
            if entry is not None:
                children.setdefault(entry.parent, []).append(b)
        return children

    def _describe(self, b: int, lru: dict[int, int], decode: Decode | None, width: int) -> list[str]:
        bm = self.block_manager
        entry, ref = bm.entries[b], bm.ref_count[b]
        lines = [f"block {b}  #{short_hash(entry.block_hash)}", f"ref {ref}" + (f", LRU #{lru[b]}" if ref == 0 else "")]
        if decode is not None:
            lines.append(_snippet(decode(list(entry.token_ids)), width))
        return lines

    def to_dot(self, name: str = "prefix_cache", decode: Decode | None = None, width: int = 22) -> str:
        """The implicit tree: a node per cached block with its ref count (and LRU position when free), an edge
        from its parent; each running sequence points at its deepest cached block; the LRU free queue below."""
        bm = self.block_manager
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
            dot.node(f"b{b}", "\n".join(self._describe(b, lru, decode, width)) + "\n", fillcolor=color,
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
        for seq in sorted(self.holders.values(), key=lambda s: s.seq_id):
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

    def to_text(self, decode: Decode | None = None, width: int = 48) -> str:
        """The same tree as text, with each run of single-child blocks on one line (what a radix tree, in
        chapter 4, stores as one edge)."""
        bm = self.block_manager
        children = self._children()
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
                state += f", free (LRU #{spots[0]}" + (f"..{spots[-1]})" if len(spots) > 1 else ")")
            text = ""
            if decode is not None:
                text = "  " + _snippet(decode([t for c in chain for t in bm.entries[c].token_ids]), width)
            name = f"block {b}" if len(chain) == 1 else f"blocks {_ranges(chain)}"
            lines.append(f"{indent}{'└─ ' if last else '├─ '}{note}{name}  [{len(chain) * self.block_size} tok, "
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
