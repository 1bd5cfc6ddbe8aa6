"""BlockRadixTree: chapter 4's token-level radix tree, with whole blocks on its edges instead of slots.

The tree still routes token by token, so two prompts may part anywhere. Storage, though, is chapter 2's
BlockManager with `block_size` tokens per block, and an edge cannot own "tokens 80..89 of a block". The
Pico-vLLM write-up settles who owns a block: **the edge that holds the block's last token**. Two things follow,
and the chapter rests on them (the README derives both):
- splitting an edge at any token splits its block list by the same rule, whatever the alignment (the
  write-up's example: a 96-token edge [B0..B5] cut after 90 tokens keeps [B0..B4]; the tail gets [B5]);
- the path down to a node at depth d owns exactly the full blocks of that prefix, so a match that stops
  anywhere returns block-aligned blocks by construction, and the bridge aligns in one place.

The tokens of a prefix's last, partial block are in the tree (they route) but their K/V are not shared:
that block belongs to the edge below, or to nobody yet. Everything else (match, insert, split, locks, LRU
eviction, invariants) is chapter 4's code, which asks `span` how many values an edge holds.
"""
from __future__ import annotations

from step04_radix.radix_tree import RadixTree, TreeNode


class BlockRadixTree(RadixTree):
    """A RadixTree whose `TreeNode.value` lists block ids: the blocks whose last token is on the node's edge."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size  # the pool's (`PoolGeometry`, checked there)
        super().__init__()

    def span(self, start: int, end: int) -> int:
        """How many blocks an edge over path positions [start, end) owns, by the last-token rule above: the
        count must come out right for an edge that starts or ends inside a block."""
        # BEGIN SOLUTION task5.span points=2
        return end // self.block_size - start // self.block_size
        # END SOLUTION

    # chapter 4's readers, named for what the values are here
    def prefix_blocks(self, node: TreeNode) -> list[int]:
        """The blocks on the path to `node`: the full blocks of its prefix."""
        return self.prefix_slots(node)

    def all_blocks(self) -> list[int]:
        """Every block the tree holds (one reference each)."""
        return self.all_slots()
