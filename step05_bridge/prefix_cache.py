"""PrefixCache: the Pico-vLLM write-up's bridge between a token-level radix tree and a block-level BlockManager.

Three layers, each with one job:

    BlockRadixTree   token granularity: where do prompts share a prefix?   (match_prefix, insert, lock_ref)
         |
    PrefixCache      aligns to blocks and keeps the two levels of reference counts consistent   (this file)
         |
    BlockManager     block granularity: which blocks are in use?   (allocate, retain, release)

Two reference counts answer two different questions:
- `BlockManager.ref_count[b]` — *may this block be freed?* It counts holders: every live request whose
  block table lists `b`, plus one if the tree holds `b` (the tree is one holder however many of its nodes
  were split around the block). At 0 the block is free. This is the only count that protects data.
- `TreeNode.lock_ref` — *should this prefix stay cached?* It counts live requests whose cached prefix
  runs through the node. It only steers eviction: unlocked leaves go first, least recently used first.

    ref_count[b] = #{live requests r : b in r.block_table} + [b is held by the tree]        (checked)

It is the inode / hard-link split of a file system: the BlockManager is the inode table (an inode is freed
at link count 0), the tree is the directory tree (removing a name does not free a file that is open).

Life of a request (chapter 4's, with blocks and a second count):
1. admission: `get_computed_blocks` matches all but the last token; the tree returns the full blocks on the
   path, so the match is block-aligned by construction. `allocate_slots` locks the node where the match ends,
   takes a reference on each shared block, evicts unlocked leaves if the free list is short, allocates the rest;
2. after each prefill chunk: `cache_unfinished_req` inserts the computed tokens (the tree takes a reference on
   each block it adopts), swaps any block the request computed twice for the tree's copy, and moves the lock;
3. finish, abort or preemption: `cache_finished_req` inserts what was computed, then releases exactly the
   blocks its block table lists — never blocks found by matching its tokens again (the write-up's "release by
   re-match" mistake) — and unlocks.
"""
from __future__ import annotations

from collections import Counter, deque

from step01_kvcache.generate import SamplingParams
from step02_paged.block_manager import BlockManager
from step02_paged.cache_manager import CacheManager, cdiv
from step02_paged.kv_cache_manager import check_block_tables, table_slot_usage
from step04_radix.radix_cache import RadixSequence, TreeMatch, check_match

from .block_radix_tree import BlockRadixTree


class PrefixCache(CacheManager):
    """A BlockRadixTree over a BlockManager of `num_blocks` blocks of `block_size` tokens."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        self.block_size = block_size
        self.block_manager = BlockManager(num_blocks)
        self.tree = BlockRadixTree(block_size)
        self.holders: dict[int, RadixSequence] = {}
        self.num_evicted = 0  # blocks taken back from the tree under memory pressure
        # the first admission of each request, (seq_id, prompt tokens, of them cached), for hit rates
        self.admissions: deque[tuple[int, int, int]] = deque(maxlen=4096)

    def new_sequence(self, seq_id: int, prompt_ids: list[int], params: SamplingParams) -> RadixSequence:
        return RadixSequence(seq_id, prompt_ids, params)

    # ---- admission ---------------------------------------------------------------------------------------
    def get_computed_blocks(self, seq: RadixSequence) -> TreeMatch:
        """The full blocks of the longest cached prefix (all but the last token may match) and the node where
        the token match ends. Block-aligned by construction: the path to a node at depth d owns d // B blocks."""
        blocks, node = self.tree.match_prefix(seq.all_token_ids[: seq.num_tokens - 1])
        return TreeMatch(tuple(blocks), len(blocks) * self.block_size, node)

    def allocate_slots(self, seq: RadixSequence, num_new_tokens: int, match: TreeMatch | None = None) -> bool:
        """Room for `num_new_tokens` more tokens, all or nothing. On admission the match's node is locked first
        (so that the eviction that may follow cannot take it) and the request holds each shared block."""
        admitting = seq.seq_id not in self.holders
        hits = list(match.blocks) if match else []
        check_match(self.tree, seq, admitting, match)
        bm = self.block_manager
        node = match.node if hits else self.tree.root
        computed = len(hits) * self.block_size if hits else seq.num_computed_tokens
        need = max(0, cdiv(computed + num_new_tokens, self.block_size) - len(seq.block_table) - len(hits))
        if admitting:
            self.tree.inc_lock_ref(node)
        if need > bm.num_free:
            self.evict(need - bm.num_free)
        if not bm.can_allocate(need):
            if admitting:
                self.tree.dec_lock_ref(node)
            return False
        if admitting:
            bm.retain(hits)  # level 1: the request holds the blocks it shares with the tree
            seq.block_table, seq.num_computed_tokens = hits, computed
            seq.last_node, seq.cache_protected_len = node, self.tree.depth(node)
            seq.num_prefill_tokens = seq.num_tokens
            self.holders[seq.seq_id] = seq
            if seq.record_prompt_hit(computed):
                self.admissions.append((seq.seq_id, seq.num_prompt_tokens, computed))
        seq.block_table += bm.allocate(need)
        return True

    def evict(self, num: int) -> int:
        """Free at least `num` blocks from unlocked leaves, least recently used first: the tree drops its
        reference, and a block of an unlocked node has no other holder, so it is free at once."""
        freed = self.tree.evict(num, self.block_manager.release)
        self.num_evicted += freed
        return freed

    # ---- caching computed tokens -------------------------------------------------------------------------
    def on_computed(self, seq: RadixSequence) -> None:
        """After a prefill chunk (not after a decode step) the computed tokens join the tree at once."""
        if seq.num_computed_tokens <= seq.num_prefill_tokens:
            self.cache_unfinished_req(seq)

    def _insert(self, seq: RadixSequence) -> int:
        """Insert the computed tokens with the full blocks that hold them. The tree takes a reference on each
        block it adopts, and only on those: a prefix it held already keeps the reference it has.
        Returns how many tokens were inserted."""
        # BEGIN SOLUTION task5.insert
        n = seq.num_computed_tokens
        blocks = seq.block_table[: n // self.block_size]
        cached = self.tree.insert(seq.all_token_ids[:n], blocks)
        self.block_manager.retain(blocks[cached // self.block_size:])  # level 2: the tree's reference
        return n
        # END SOLUTION

    def cache_unfinished_req(self, seq: RadixSequence) -> None:
        """Give the computed prefix to the tree and keep using it through a lock on its last node. Where the
        request computed a block the tree already had (two requests prefilled the same prompt at once), it
        takes a reference on the tree's block and drops its own, which frees it."""
        n = self._insert(seq)
        blocks, node = self.tree.match_prefix(seq.all_token_ids[:n])
        # BEGIN SOLUTION task5.dedup
        own = seq.block_table[: len(blocks)]
        swap = [i for i, (mine, theirs) in enumerate(zip(own, blocks)) if mine != theirs]
        self.block_manager.retain([blocks[i] for i in swap])
        self.block_manager.release([own[i] for i in swap])
        seq.block_table[: len(blocks)] = blocks
        # END SOLUTION
        self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(seq.last_node)
        seq.last_node, seq.cache_protected_len = node, n

    def cache_finished_req(self, seq: RadixSequence) -> None:
        """Cache what was computed, then drop every reference the request holds — the ones in its block table,
        never blocks found by matching its tokens again — and unlock."""
        self._insert(seq)
        self.block_manager.release(seq.block_table[::-1])
        self.tree.dec_lock_ref(seq.last_node)
        seq.block_table, seq.last_node, seq.cache_protected_len = [], None, 0

    def free(self, seq: RadixSequence) -> None:
        """Finish, abort or preemption: what the sequence computed stays cached."""
        if seq.seq_id in self.holders:
            self.cache_finished_req(seq)
            del self.holders[seq.seq_id]

    def reset_cache(self) -> None:
        """Drop every cached block (nobody may hold a lock): the tree's references are released."""
        if self.holders or self.tree.protected_size:
            raise ValueError(f"{len(self.holders)} sequences still use the cache; reset only a drained engine")
        self.block_manager.release(self.tree.all_blocks())
        self.tree.reset()

    # ---- accounting --------------------------------------------------------------------------------------
    @property
    def num_cached_blocks(self) -> int:
        return len(self.tree.all_blocks())

    def private_blocks(self, seq: RadixSequence) -> list[int]:
        """The part of the block table after the tree's full blocks of the locked prefix: the request's own."""
        return seq.block_table[seq.cache_protected_len // self.block_size:]

    def slot_usage(self) -> tuple[int, int]:
        """As chapter 2 counts it: the blocks live requests hold, a shared block once."""
        return table_slot_usage(self.holders.values(), self.block_size)

    def check_invariants(self) -> None:
        """The tree's; the two-level count (ref_count = block tables listing the block + 1 if the tree holds
        it); each request's place in the tree; each lock_ref counting the requests under it; a private block
        is its request's alone, and a block of an unlocked node the tree's alone (evicting it frees memory)."""
        tree, bm = self.tree, self.block_manager
        tree.check_invariants()
        bm.check_invariants()
        check_block_tables(list(self.holders.values()), bm, self.block_size, Counter(tree.all_blocks()))
        locks: Counter = Counter()
        for seq in self.holders.values():
            node = seq.last_node
            assert node is not None and tree.contains(node), f"sequence {seq.seq_id} holds no node of the tree"
            assert seq.cache_protected_len == tree.depth(node), \
                f"sequence {seq.seq_id}: cache_protected_len {seq.cache_protected_len} != depth of its last_node"
            shared = seq.cache_protected_len // self.block_size
            assert seq.block_table[:shared] == tree.prefix_blocks(node), \
                f"sequence {seq.seq_id}: block table does not start with the tree's blocks of its prefix"
            assert seq.all_token_ids[: seq.cache_protected_len] == tree.prefix_tokens(node), \
                f"sequence {seq.seq_id}: its last_node's path is not its own prefix"
            for b in self.private_blocks(seq):
                assert bm.ref_count[b] == 1, f"sequence {seq.seq_id}: private block {b} has ref_count {bm.ref_count[b]}"
            locks.update(n.id for n in tree.path(node))
        for node in tree.nodes():
            assert node.lock_ref == locks.get(node.id, 0), \
                f"{node!r}: lock_ref {node.lock_ref} but {locks.get(node.id, 0)} live requests lock it"
            if node.lock_ref == 0:
                for b in node.value:
                    assert bm.ref_count[b] == 1, f"block {b} of unlocked {node!r} has ref_count {bm.ref_count[b]}: " \
                                                 "someone uses it without locking its node"
