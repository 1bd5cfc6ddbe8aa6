"""Where the caches of chapters 3-5 learn and forget blocks, made to report it as KV events (kv_events.py).

Each design has one place that decides what is cached, and the events come from exactly there, by subclassing that
one structure and wrapping its public methods (no earlier chapter has a hook for this):
- chapter 3's hash map (`PrefixCachingBlockManager`): `cache_block` publishes a full block under its hash (stored,
  unless that content is cached already), `allocate` evicts the cached free blocks it takes (removed), `reset`
  forgets everything (cleared);
- chapters 4-5's radix tree: `insert` adopts the values past what it had (stored: their hashes are chapter 3's chain
  over the inserted tokens), `evict` drops leaves (removed), `reset` forgets everything (cleared).
The radix cache of chapter 4 has one token per slot, so it reports blocks of one token (`block_size` 1): exact, but a
router that names prompts by 16-token blocks cannot match them; chapter 5's bridge reports blocks of its pool's size.

`with_events(manager_class, log)` is a manager factory for chapter 2's `Engine`: it builds the manager and swaps its
empty index for the reporting one. `cached_blocks(manager)` reads what the manager holds in the same terms as
`CacheView`, which rebuilds it from the events: the two must agree at every moment between steps.
"""
from __future__ import annotations

from collections.abc import Callable
from itertools import islice

from step02_paged import CacheManager, KVCacheManager, PoolGeometry
from step02_paged.kv_pool import KVPool
from step03_prefix_hash import CacheEntry, PrefixCachingBlockManager, PrefixCachingKVCacheManager, hash_token_blocks
from step04_radix import RadixKVCacheManager, RadixTree, TreeCacheManager, TreeNode
from step05_bridge import BlockRadixTree, BridgeKVCacheManager

from .kv_events import EventLog, wire_hash

DESIGNS = {"none": KVCacheManager, "hash": PrefixCachingKVCacheManager, "radix": RadixKVCacheManager,
           "bridge": BridgeKVCacheManager}  # the cache managers of chapters 2-5, by the name the command line uses


class HashIndexEvents(PrefixCachingBlockManager):
    """Chapter 3's hash -> block map, reporting what it stores, evicts and forgets."""

    def __init__(self, num_blocks: int, log: EventLog) -> None:
        super().__init__(num_blocks)
        self.log = log

    def cache_block(self, block: int, entry: CacheEntry) -> bool:
        new = self.entries[block] is None and entry.block_hash not in self.cached
        published = super().cache_block(block, entry)
        if new and published:
            self.log.stored([entry.block_hash], entry.parent, list(entry.token_ids))
        return published

    def allocate(self, n: int) -> list[int]:
        taken = [self.entries[b] for b in islice(self.free_blocks, n)]  # allocation takes the queue's front
        blocks = super().allocate(n)
        self.log.removed([e.block_hash for e in taken if e is not None])
        return blocks

    def reset(self) -> int:
        dropped = super().reset()
        if dropped:
            self.log.cleared()
        return dropped


class TreeEvents:
    """Chapters 4-5's tree, reporting the values it adopts and drops (a mixin before the tree class). It keeps each
    adopted value's hash, so that a removal needs no hashing."""

    log: EventLog
    hashes: dict[int, bytes]  # value (block or slot id) -> its block hash, for every value the tree holds

    def insert(self, tokens: list[int], values: list[int]) -> int:
        cached = super().insert(tokens, values)
        bs, tokens, values = self.log.block_size, list(tokens), list(values)
        first, end = self.span(0, cached), self.span(0, len(tokens))  # the values adopted: values[first:end]
        if end > first:
            chain = hash_token_blocks(tokens[:end * bs], bs)
            self.hashes.update(zip(values[first:end], chain[first:]))
            self.log.stored(chain[first:], chain[first - 1] if first else None, tokens[first * bs:end * bs])
        return cached

    def evict(self, num: int, on_evict: Callable[[TreeNode], object]) -> int:
        def dropped(leaf: TreeNode) -> None:
            self.log.removed([self.hashes.pop(v) for v in leaf.value])
            on_evict(leaf)
        return super().evict(num, dropped)

    def reset(self) -> None:
        super().reset()
        if self.hashes:
            self.hashes.clear()
            self.log.cleared()


class RadixTreeEvents(TreeEvents, RadixTree):
    def __init__(self, log: EventLog) -> None:
        self.log, self.hashes = log, {}
        RadixTree.__init__(self)


class BlockRadixTreeEvents(TreeEvents, BlockRadixTree):
    def __init__(self, block_size: int, log: EventLog) -> None:
        self.log, self.hashes = log, {}
        BlockRadixTree.__init__(self, block_size)


def with_events(manager: Callable[[PoolGeometry, KVPool | None], CacheManager],
                log: EventLog) -> Callable[[PoolGeometry, KVPool | None], CacheManager]:
    """A manager factory for `Engine`: `manager(geometry, pool)` with its index reporting to `log`. Chapter 2's
    paging alone caches nothing and reports nothing."""
    def make(geometry: PoolGeometry, pool: KVPool | None = None) -> CacheManager:
        built = manager(geometry, pool)
        log.block_size = geometry.block_size
        if isinstance(built, PrefixCachingKVCacheManager):
            built.block_manager = HashIndexEvents(geometry.num_blocks, log)
        elif isinstance(built, TreeCacheManager):
            built.tree = BlockRadixTreeEvents(geometry.block_size, log) if isinstance(built.tree, BlockRadixTree) \
                else RadixTreeEvents(log)
        return built
    return make


def cached_blocks(manager: CacheManager) -> dict[int, tuple[int | None, tuple[int, ...]]]:
    """Every block the manager's cache holds, as `CacheView` names them: wire hash -> (parent's, its tokens)."""
    bs, out = manager.block_size, {}
    if isinstance(manager, PrefixCachingKVCacheManager):
        for h in manager.block_manager.cached:
            entry = manager.block_manager.entries[manager.block_manager.cached[h]]
            out[wire_hash(h)] = (None if entry.parent is None else wire_hash(entry.parent), entry.token_ids)
    elif isinstance(manager, TreeCacheManager):
        for node in manager.tree.nodes():
            tokens = manager.tree.prefix_tokens(node)
            chain = hash_token_blocks(tokens, bs)
            for i in range(len(chain) - len(node.value), len(chain)):
                out[wire_hash(chain[i])] = (wire_hash(chain[i - 1]) if i else None,
                                            tuple(tokens[i * bs:(i + 1) * bs]))
    return out
