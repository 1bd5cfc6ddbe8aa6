"""OffsetRadixTree: the mini-runtime textbook's block radix tree, whose unit of reuse is the whole block, with an
offset on a branch that was cut inside a block.

The bridge's tree (block_radix_tree.py) cuts an edge at the very token where two prompts part and gives each block
to the edge that holds its last token. The textbook cuts at a block boundary instead: the token-level common
length `common`, aligned down, `aligned = common // B * B`. The upper node keeps the blocks before `aligned`, the
original branch keeps the rest of its blocks, and the new prompt's branch hangs beside it, prefilled again from
`aligned`. The `common - aligned` tokens the two branches share inside their first block are in both first blocks:
computed twice, lent by neither, since the common part is shorter than a block. That count is a branch's
`offset`: its own tokens start at slot `offset` of its first block; the slots before it are the ones the textbook
calls dead. Its example (B = 16): a second prompt shares 20 tokens with a first one cached in blocks 100, 101,
102; after the split the upper node holds 100, the first prompt's branch 101 and 102 with offset 4, and the second
prompt's branch 200, from token 16.

Every edge then starts at a block boundary and holds whole blocks, so chapter 4's tree does the work if its
"tokens" are blocks: a key entry is the tuple of one block's tokens, its value the block id (chapter 4's `span`,
one value per key entry), children are filed under their first block, and chapter 4's split at a key position is
a split at a block boundary. Match, insert, locks, LRU eviction and invariants are chapter 4's code
(`BlockKeyedTree`); this module adds the offsets and speaks tokens to the cache manager (`OffsetRadixTree`).

Built, the design keeps two things the textbook leaves open, for safety: a branch's edge still spells its dead
slots' tokens (the textbook's nodes store their whole token list), because reusing block 101 means trusting its
slots 0-3 too; and the tree holds full blocks only (a partial last block stays its request's, as in the bridge).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from step04_radix.radix_tree import RadixTree, TreeNode, common_prefix_len

Block = tuple[int, ...]  # the tokens of one full block: a key entry of the block-keyed tree


def branch_offset(first: Sequence[int], siblings: Iterable[Sequence[int]]) -> int:
    """The offset of a branch whose first block holds the tokens `first`: how many of its leading tokens some
    sibling's first block holds too (the most over `siblings`; 0 without any). Those slots were computed in both
    branches and can be lent by neither: the tokens they share end inside the block."""
    # BEGIN SOLUTION task5.offset points=2
    first = list(first)
    return max((common_prefix_len(first, list(other)) for other in siblings), default=0)
    # END SOLUTION


class OffsetNode(TreeNode):
    """A node of the block-keyed tree: chapter 4's node, plus the branch's offset."""

    __slots__ = ("offset",)

    def __init__(self, node_id: int, key: list[Block], value: list[int], parent: TreeNode | None,
                 last_access: int = 0) -> None:
        super().__init__(node_id, key, value, parent, last_access)
        self.offset = 0  # leading slots of its first block that a sibling's first block holds too

    def __repr__(self) -> str:
        return (f"OffsetNode(#{self.id}, {len(self.key)} blocks {self.value}, offset={self.offset}, "
                f"lock_ref={self.lock_ref}, t={self.last_access})")


class BlockKeyedTree(RadixTree):
    """Chapter 4's tree over blocks: each key entry is a block's tokens and each value a block id. It keeps every
    node's offset right whenever the children of a node change: a leaf added or deleted, an edge split."""

    def _new_node(self, key: list[Block], value: list[int], parent: TreeNode | None) -> OffsetNode:
        node = OffsetNode(self._next_id, key, value, parent, self._clock)
        self._next_id += 1
        return node

    def _split_node(self, child: OffsetNode, start: int, split_len: int) -> OffsetNode:
        """Chapter 4's split, at a block boundary: the upper node takes child's place among its siblings with the
        same first block, so with child's offset; child, now its only child, has no sibling: offset 0."""
        upper = super()._split_node(child, start, split_len)
        upper.offset, child.offset = child.offset, 0
        return upper

    def _add_leaf(self, parent: TreeNode, key: list[Block], value: list[int]) -> OffsetNode:
        """A new branch: its offset against its siblings, and theirs against it (only the new one can raise them)."""
        leaf = super()._add_leaf(parent, key, value)
        siblings = [c for c in parent.children.values() if c is not leaf]
        leaf.offset = branch_offset(leaf.key[0], (s.key[0] for s in siblings))
        for s in siblings:
            s.offset = max(s.offset, branch_offset(s.key[0], [leaf.key[0]]))
        return leaf

    def _delete_leaf(self, leaf: OffsetNode) -> None:
        """An evicted branch: a sibling whose offset it set may have a smaller one now."""
        parent = leaf.parent
        super()._delete_leaf(leaf)
        for s in parent.children.values():
            if s.offset and s.offset == branch_offset(s.key[0], [leaf.key[0]]):
                s.offset = branch_offset(s.key[0], (o.key[0] for o in parent.children.values() if o is not s))

    def check_invariants(self) -> None:
        """Chapter 4's, then every node's offset against its siblings' first blocks."""
        super().check_invariants()
        for node in (self.root, *self.nodes()):
            for child in node.children.values():
                want = branch_offset(child.key[0], (s.key[0] for s in node.children.values() if s is not child))
                assert child.offset == want, \
                    f"{child!r}: offset {child.offset}, but its siblings' first blocks share {want} leading tokens"


class OffsetRadixTree:
    """The textbook's tree as a cache manager asks about it (chapter 4's interface, the one TreeCacheManager uses):
    positions and prefixes in tokens, values in blocks. Underneath, `blocks` is a BlockKeyedTree; this class turns
    tokens into whole blocks on the way in and back on the way out, and reports offsets."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size  # the pool's (`PoolGeometry`, checked there)
        self.blocks = BlockKeyedTree()

    def _keys(self, tokens: Sequence[int]) -> list[Block]:
        """The full blocks of `tokens`, as key entries (a partial last block is nobody's key yet)."""
        bs = self.block_size
        return [tuple(tokens[i: i + bs]) for i in range(0, len(tokens) // bs * bs, bs)]

    # ---- match and insert, in tokens -----------------------------------------------------------------------
    def match(self, tokens: Sequence[int]) -> tuple[list[int], OffsetNode, int]:
        """The blocks of the longest cached prefix of `tokens` (whole blocks: a multiple of block_size tokens),
        the node where it ends, and the offset: how many of the next tokens the tree holds too, at the head of a
        child's first block, which the request must compute again."""
        blocks, node = self.match_prefix(tokens)
        rest = tokens[len(blocks) * self.block_size: (len(blocks) + 1) * self.block_size]
        return blocks, node, branch_offset(rest, (c.key[0] for c in node.children.values()))

    def match_prefix(self, tokens: Sequence[int]) -> tuple[list[int], OffsetNode]:
        """Chapter 4's match, over the full blocks of `tokens`."""
        return self.blocks.match_prefix(self._keys(tokens))

    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> int:
        """Cache the full blocks of `tokens`, held in `blocks` (one per full block); returns how many leading
        tokens were cached already (whole blocks: the caller keeps those of its blocks). Where the tokens part from
        an edge inside a block, the edge is cut at the block boundary before it and both branches get an offset."""
        keys = self._keys(tokens)
        if len(blocks) != len(keys):
            raise ValueError(f"{len(tokens)} tokens hold {len(keys)} full blocks, got {len(blocks)} block ids")
        return self.blocks.insert(keys, blocks) * self.block_size

    # ---- reading, in tokens ------------------------------------------------------------------------------
    def span(self, start: int, end: int) -> int:
        """Blocks that the tokens at positions [start, end) fill: every edge starts and ends on a block boundary."""
        return (end - start) // self.block_size

    def depth(self, node: TreeNode) -> int:
        return self.blocks.depth(node) * self.block_size

    def prefix_tokens(self, node: TreeNode) -> list[int]:
        return [t for key in self.blocks.prefix_tokens(node) for t in key]

    # ---- the rest does not depend on the unit: the block tree's own ------------------------------------------
    @property
    def root(self) -> OffsetNode:
        return self.blocks.root

    @property
    def evictable_size(self) -> int:
        return self.blocks.evictable_size

    @property
    def protected_size(self) -> int:
        return self.blocks.protected_size

    @property
    def total_size(self) -> int:
        return self.blocks.total_size

    def reset(self) -> None:
        self.blocks.reset()

    def inc_lock_ref(self, node: TreeNode) -> None:
        self.blocks.inc_lock_ref(node)

    def dec_lock_ref(self, node: TreeNode) -> None:
        self.blocks.dec_lock_ref(node)

    def evict(self, num: int, on_evict: Callable[[TreeNode], object]) -> int:
        return self.blocks.evict(num, on_evict)

    def nodes(self):
        return self.blocks.nodes()

    def path(self, node: TreeNode) -> list[TreeNode]:
        return self.blocks.path(node)

    def contains(self, node: TreeNode) -> bool:
        return self.blocks.contains(node)

    def prefix_slots(self, node: TreeNode) -> list[int]:
        return self.blocks.prefix_slots(node)

    def all_slots(self) -> list[int]:
        return self.blocks.all_slots()

    prefix_blocks, all_blocks = prefix_slots, all_slots  # named for what the values are here, as the bridge's

    def check_invariants(self) -> None:
        """The block tree's, and every key entry a full block."""
        self.blocks.check_invariants()
        for node in self.blocks.nodes():
            assert all(len(key) == self.block_size for key in node.key), \
                f"{node!r}: a key entry is not a full block of {self.block_size} tokens"
