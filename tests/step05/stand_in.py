"""Stand-ins for the bridge's homework bodies, written for chapter 5's tests, so that each task is graded on its own:
`bridge_with("task5.dedup")` is a BridgeKVCacheManager whose duplicate swap is the student's and whose other
bodies of the chapter (the block tree's span, the insert, the host pool's copies, the load back) are the plain
versions below. Chapter 4's tree runs as written (an earlier chapter).

The plain versions say what a correct body does, as plainly as is clear: a block counted where its last token
lies, references taken and dropped one block at a time, K/V copied block by block.
"""
from __future__ import annotations

from step04_radix.tree_cache import RadixSequence, TreeCacheManager, TreeMatch
from step05_bridge.block_radix_tree import BlockRadixTree
from step05_bridge.bridge_cache import BridgeKVCacheManager, TieredMatch
from step05_bridge.host_pool import HostPool


class StandInBlockTree(BlockRadixTree):
    """The block tree with its `span` (task5.span) written plainly."""

    def span(self, start: int, end: int) -> int:
        """The blocks whose last token (positions B-1, 2B-1, ...) lies in [start, end)."""
        first_last_token = start + (-start - 1) % self.block_size
        return len(range(first_last_token, end, self.block_size))


class StandInHostPool(HostPool):
    """The host pool with its copies (task5.host_tier) written plainly: block by block, waiting for each."""

    def save(self, device_blocks: list[int], host_blocks: list[int]) -> None:
        for device, host in zip(device_blocks, host_blocks, strict=True):
            for ours, theirs in ((self.k, self.pool.k), (self.v, self.pool.v),
                                 *zip(self.scales, self._device_scales())):
                ours[host] = theirs[:, device].cpu()
        self.blocks_saved += len(device_blocks)

    def load(self, host_blocks: list[int], device_blocks: list[int]) -> None:
        for host, device in zip(host_blocks, device_blocks, strict=True):
            for ours, theirs in ((self.k, self.pool.k), (self.v, self.pool.v),
                                 *zip(self.scales, self._device_scales())):
                theirs[:, device] = ours[host].to(theirs.device)
        self.blocks_loaded += len(host_blocks)


class StandInBridge(BridgeKVCacheManager):
    """Every homework body of the bridge, written plainly; `bridge_with` puts the student's back, task by task."""

    own_span = own_host_tier = False  # whether the block trees and the host pool are the student's

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        if not self.own_span:
            self.tree = StandInBlockTree(self.block_size)
            self.host_tree = StandInBlockTree(self.block_size) if self.host_tree is not None else None

    def _host_pool(self) -> HostPool:
        if self.host is None and not self.own_host_tier and self.pool is not None:
            self.host = StandInHostPool(self.pool, self.host_blocks)
        return super()._host_pool()

    def _insert(self, seq: RadixSequence) -> int:
        tokens = seq.all_token_ids[: seq.num_computed_tokens]
        blocks = seq.block_table[: self.tree.span(0, len(tokens))]
        already = self.tree.insert(tokens, blocks)
        for block in blocks[self.tree.span(0, already):]:  # adopted: the tree holds them now
            self.block_manager.retain([block])
        return len(tokens)

    def _use_tree_values(self, seq: RadixSequence, start: int, blocks: list[int]) -> None:
        for i in range(start, len(blocks)):
            duplicate = seq.block_table[i]
            if duplicate != blocks[i]:  # hold the tree's block, drop the copy
                self.block_manager.retain([blocks[i]])
                self.block_manager.release([duplicate])
        seq.rewrite_blocks(start, blocks[start:])

    def _load_back(self, seq: RadixSequence, num_new_tokens: int, match: TieredMatch) -> TreeMatch | None:
        self._check_match(seq, True, TreeMatch(match.blocks, len(match.blocks) * self.block_size, match.node))
        if not self.host_tree.contains(match.host_node) or \
                self.host_tree.prefix_blocks(match.host_node)[len(match.blocks):] != list(match.host_blocks):
            raise ValueError(f"sequence {seq.seq_id}: stale match, its host part was dropped since the lookup; "
                             "call get_computed_blocks again")
        held = ((self.tree, match.node or self.tree.root), (self.host_tree, match.host_node))
        need = self.blocks_needed(seq, num_new_tokens, match)
        for tree, node in held:  # what is about to be read stays while room is made
            tree.inc_lock_ref(node)
        try:
            short = need - self.block_manager.num_free
            if short > 0:
                self.evict(short)
        finally:
            for tree, node in held:
                tree.dec_lock_ref(node)
        if self.block_manager.num_free < need:
            return None
        copies = self.block_manager.allocate(len(match.host_blocks))
        self._host_pool().load(list(match.host_blocks), copies)
        self.tree.insert(seq.all_token_ids[: match.num_tokens], [*match.blocks, *copies])
        return TreeCacheManager.get_computed_blocks(self, seq)


BODIES = {"task5.insert": ("_insert",), "task5.dedup": ("_use_tree_values",), "task5.load_back": ("_load_back",)}


def bridge_with(*tasks: str) -> type[BridgeKVCacheManager]:
    """A bridge class whose bodies of `tasks` are the student's (BridgeKVCacheManager's, BlockRadixTree's span,
    HostPool's copies), the others the stand-in's."""
    own: dict[str, object] = {name: getattr(BridgeKVCacheManager, name) for task in tasks
                              for name in BODIES.get(task, ())}
    own.update(own_span="task5.span" in tasks, own_host_tier="task5.host_tier" in tasks)
    return type(f"BridgeWith_{'_'.join(t.split('.')[1] for t in tasks)}", (StandInBridge,), own)
