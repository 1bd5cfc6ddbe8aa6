"""PrefixCache: seed 000's bridge between a token-level radix tree and a block-level BlockManager.

Three layers, each with one job (seed 000's design):

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
Chapter 4 needed one count because the tree and the slot pool were one owner model; chapter 3 needed one
because a hash table has no structure to lock. With a separate tree and block manager you need both.

Compared with chapter 4's RadixKVCacheManager, which this class extends, four things change:
`_share` (a request that shares cached blocks holds references on them), `_insert` (the tree takes its own
reference on the blocks it adopts), `_use_tree_values` (a request that computed a block the tree already
had swaps its copy for the tree's) and `cache_finished_req` (a finishing request releases exactly the
blocks its block table holds — never blocks found by matching again, seed 000's Bug 1).
"""
from __future__ import annotations

from collections import Counter

from course.draw import Dot
from step02_paged.kv_cache_manager import KVCacheManager
from step04_radix.radix_cache import RadixKVCacheManager, RadixSequence
from step04_radix.radix_tree import Decode

from .block_radix_tree import BlockRadixTree


class PrefixCache(RadixKVCacheManager):
    """A BlockRadixTree over a BlockManager of `num_blocks` blocks of `block_size` tokens."""

    tree: BlockRadixTree

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_blocks, block_size)

    def _make_tree(self) -> BlockRadixTree:
        return BlockRadixTree(self.block_size)

    # ---- level 1: the requests' references ----------------------------------------------------------------
    def _share(self, blocks: list[int]) -> None:
        """A request that reuses cached blocks holds a reference on each (chapter 2's rule, which chapter 4's
        single-owner model had switched off)."""
        # BEGIN SOLUTION task5.share
        self.block_manager.retain(blocks)
        # END SOLUTION

    # ---- level 2: the tree's reference ----------------------------------------------------------------------
    def _insert(self, seq: RadixSequence) -> int:
        """Insert the computed tokens with the full blocks that hold them; the tree takes a reference on each
        block it adopts (those of the new leaf, the first `cached // block_size` were in the tree already).
        Returns how many tokens were inserted."""
        # BEGIN SOLUTION task5.insert
        n = seq.num_computed_tokens
        blocks = seq.block_table[: n // self.block_size]
        cached = self.tree.insert(seq.all_token_ids[:n], blocks)
        self.block_manager.retain(blocks[cached // self.block_size:])
        return n
        # END SOLUTION

    def _use_tree_values(self, seq: RadixSequence, blocks: list[int]) -> None:
        """Make the block table start with the tree's blocks of the prefix: where the request computed a block
        the tree already had (two requests prefilled the same prompt at once), it takes a reference on the
        tree's block and drops its own, which frees it."""
        # BEGIN SOLUTION task5.insert
        own = seq.block_table[: len(blocks)]
        swap = [i for i, (mine, tree) in enumerate(zip(own, blocks)) if mine != tree]
        self.block_manager.retain([blocks[i] for i in swap])
        self.block_manager.release([own[i] for i in swap])
        seq.block_table[: len(blocks)] = blocks
        # END SOLUTION

    def cache_finished_req(self, seq: RadixSequence) -> None:
        """Finish, abort or preemption: cache what was computed, then drop every reference the request holds —
        the ones in its block table, never blocks found by matching its tokens again (Bug 1) — and unlock."""
        # BEGIN SOLUTION task5.release
        self._insert(seq)
        self.block_manager.release(seq.block_table[::-1])
        self.tree.dec_lock_ref(seq.last_node)
        seq.block_table, seq.last_node, seq.cache_protected_len = [], None, 0
        # END SOLUTION

    # ---- accounting ---------------------------------------------------------------------------------------
    def expected_ref_counts(self) -> Counter:
        """The two-level invariant: one count per block table that lists the block, plus one for the tree."""
        return KVCacheManager.expected_ref_counts(self) + Counter(self.tree.all_slots())

    # Peak memory and waste as chapter 2 counts them: the blocks live requests hold, a shared block once.
    slot_usage = KVCacheManager.slot_usage

    def _check_ownership(self) -> None:
        """What two-level counting adds to chapter 4's checks (step02's check already compared every ref_count
        with `expected_ref_counts`): a request's private blocks are its alone, and a block of an unlocked node
        is held by the tree alone, so evicting it really frees memory."""
        ref = self.block_manager.ref_count
        for seq in self.holders.values():
            for b in self.private_slots(seq):
                assert ref[b] == 1, f"sequence {seq.seq_id}: private block {b} has ref_count {ref[b]}, not 1"
        for node in self.tree.nodes():
            if node.lock_ref == 0:
                for b in node.value:
                    assert ref[b] == 1, f"block {b} of unlocked {node!r} has ref_count {ref[b]}: " \
                                        "someone uses it without locking its node"

    @property
    def num_cached_blocks(self) -> int:
        return len(self.tree.all_slots())

    # ---- pictures ----------------------------------------------------------------------------------------
    def _describe(self, seq: RadixSequence) -> str:
        refs = [self.block_manager.ref_count[b] for b in seq.block_table]
        shared = self.tree.span(0, seq.cache_protected_len)
        return (f"seq {seq.seq_id}: locks node #{seq.last_node.id} ({seq.cache_protected_len} tokens in the tree); "
                f"block_table {seq.block_table[:shared]} from the tree + {seq.block_table[shared:]} its own; "
                f"ref_counts {refs}")

    def to_dot(self, decode: Decode | None = None, name: str = "bridge", row: int = 16) -> str:
        """The three layers in one picture: the tree (edges with their tokens, nodes with their blocks and
        lock_ref), the live requests (pointing at the node they lock) and the pool, `row` blocks per line, each
        with its ref_count: grey free, white held by the tree alone, green by one request alone, yellow by
        two or more holders (the tree and a request, or several requests)."""
        dot = Dot(name, rankdir="LR", nodesep="0.15", ranksep="0.35")
        self.tree.draw(dot, decode)
        for seq in sorted(self.holders.values(), key=lambda s: s.seq_id):
            dot.node(f"seq{seq.seq_id}", f"seq {seq.seq_id}\nblock_table {seq.block_table}",
                     shape="note", fillcolor="#e8f0fe")
            dot.edge(f"seq{seq.seq_id}", f"n{seq.last_node.id}", "last_node", style="dashed", color="#1a73e8")
        in_tree = set(self.tree.all_slots())
        colors = {"free": "#cccccc", "tree": "white", "one": "#ceead6", "shared": "#fde293"}
        cells = []
        for b in range(self.num_blocks):
            r = self.block_manager.ref_count[b]
            users = r - (b in in_tree)  # requests holding the block
            kind = "free" if r == 0 else "tree" if users == 0 else "one" if r == 1 else "shared"
            text = "free" if r == 0 else "tree" if users == 0 else f"ref {r}"
            cells.append(f'<TD PORT="b{b}" BGCOLOR="{colors[kind]}">{b}<BR/>{text}</TD>')
        table = "".join(f"<TR>{''.join(cells[i:i + row])}</TR>" for i in range(0, self.num_blocks, row))
        dot.raw(f'"pool" [shape=plaintext, fontsize=9, label=<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0">'
                f'{table}</TABLE>>];')
        dot.raw('{ rank=max; "pool"; }')
        for node in self.tree.nodes():
            for b in node.value:
                dot.raw(f'"n{node.id}" -> "pool":b{b} [style=dotted, color="#888888", arrowsize=0.5];')
        return dot.source()
