"""BlockRadixTree: chapter 4's token-level radix tree, with whole blocks on its edges instead of slots.

The tree still routes token by token, so two prompts may part anywhere. Storage, though, is chapter 2's
BlockManager with `block_size` tokens per block, and an edge cannot own "tokens 80..89 of a block". Seed
000's rule settles who owns a block: **the edge that holds the block's last token**. An edge covering the
path positions [start, end) therefore owns

    end // block_size - start // block_size        blocks

(the block boundaries it crosses). Two things follow, and the chapter rests on them:
- splitting an edge at any token splits its block list with the same formula, whatever the alignment
  (seed 000: a 96-token edge [B0..B5] cut after 90 tokens keeps [B0..B4]; the tail gets [B5]);
- the path down to a node at depth d owns exactly d // block_size blocks (the formula telescopes), the full
  blocks of that prefix. A match that stops anywhere returns block-aligned blocks by construction: the
  bridge's `aligned_len = len(blocks) * block_size` is the one place where alignment happens (Bug 2).

The tokens of a prefix's last, partial block are in the tree (they route) but their K/V are not shared:
that block belongs to the edge below, or to nobody yet. Everything else (match, insert, split, locks,
LRU eviction, drawings, invariants) is chapter 4's code, which asks `span` how many values an edge holds.
"""
from __future__ import annotations

from step04_radix.radix_tree import RadixTree


class BlockRadixTree(RadixTree):
    """A RadixTree whose `TreeNode.value` lists block ids: the blocks whose last token is on the node's edge."""

    value_name = "blocks"

    def __init__(self, block_size: int) -> None:
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.block_size = block_size
        super().__init__()

    def span(self, start: int, end: int) -> int:
        """Blocks owned by an edge over path positions [start, end): those whose last token lies inside."""
        # BEGIN SOLUTION task5.span
        return end // self.block_size - start // self.block_size
        # END SOLUTION
