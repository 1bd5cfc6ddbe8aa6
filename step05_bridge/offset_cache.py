"""OffsetKVCacheManager: the mini-runtime textbook's prefix cache as the engine's cache manager: its block radix
tree with offsets (offset_tree.py) under the bridge's two reference counts.

The textbook's table of reference counts is the bridge's two levels: a request that hits a prefix takes a
reference on each matched block, the tree takes one on each block it adopts at insert, a finished request
releases its own blocks, and eviction releases a leaf's. The blocks a running request uses are therefore safe
whatever the tree does, and an evicted leaf frees only what nobody else holds. So this manager is the bridge
(bridge_cache.py, without its host tier) over the textbook's tree; two things change:
- `get_computed_blocks` returns the whole blocks of the longest cached prefix and the match's offset (an
  `OffsetMatch`): the tokens past them that the tree holds too, inside a block it cannot lend, which the
  request computes again;
- `_insert` hands the tree the full blocks of the computed tokens and no partial one: an edge holds whole blocks,
  so the lock moves to a block boundary.
"""
from __future__ import annotations

from dataclasses import dataclass

from step02_paged.geometry import PoolGeometry
from step02_paged.kv_pool import KVPool
from step04_radix.tree_cache import RadixSequence, TreeMatch

from .bridge_cache import BridgeKVCacheManager
from .offset_tree import OffsetRadixTree


@dataclass(frozen=True)
class OffsetMatch(TreeMatch):
    """A lookup's answer with the textbook's `matched_offset`: `offset` tokens past `num_tokens` are cached too, at
    the head of a block the match cannot return (the scheduler computes them again)."""

    offset: int = 0


class OffsetKVCacheManager(BridgeKVCacheManager):
    """An OffsetRadixTree over a BlockManager of the pool's blocks, counted as the bridge counts."""

    design = "offset"

    def __init__(self, geometry: PoolGeometry, pool: KVPool | None = None) -> None:
        super().__init__(geometry, pool)
        self.tree = OffsetRadixTree(geometry.block_size)

    def get_computed_blocks(self, seq: RadixSequence) -> OffsetMatch:
        """The whole blocks of the longest cached prefix (all but the last token may match), the node where they
        end, and the offset. Looks only."""
        blocks, node, offset = self.tree.match(seq.all_token_ids[: seq.num_tokens - 1])
        return OffsetMatch(tuple(blocks), len(blocks) * self.block_size, node, offset)

    def _insert(self, seq: RadixSequence) -> int:
        """The bridge's insert (the tree retains the blocks it adopts); the tree took the full blocks only, so the
        tokens inserted, where the lock moves, end at the last full block."""
        super()._insert(seq)
        return seq.num_computed_tokens // self.block_size * self.block_size
