"""The cache-manager interface: the one object the scheduler and the engine ask about KV memory.

Paging alone (this chapter's KVCacheManager) or a cache that finds prompts again: every design answers the
same questions (vLLM v1's KVCacheManager and SGLang's cache classes ask them too), so the scheduler and the
engine are written once, against this class:

    seq = kv.new_sequence(...)                   a request, as this manager needs to see it
    match = kv.get_computed_blocks(seq)          what of its prompt is already in the pool? (looks only)
    kv.allocate_slots(seq, n, match)             room for n more tokens, the match's blocks shared first
    kv.on_computed(seq)                          a forward wrote more K/V: publish what others may reuse
    kv.free(seq)                                 finish, abort or preemption
    kv.shared_prefixes(seqs)                     which running sequences read the same first blocks right now?

The match is a handle: the lookup returns it and allocation takes it back, so nothing travels on the side.
A manager never moves `seq.num_computed_tokens`: the match says how many tokens it covers, and the scheduler
starts the sequence there (`Sequence.admit`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field

from step01_kvcache.request import SamplingParams

from .block_manager import BlockManager
from .geometry import PoolGeometry, cdiv
from .kv_pool import KVPool
from .sequence import Sequence


@dataclass(frozen=True)
class PrefixMatch:
    """What a lookup found: `blocks` hold the K/V of the sequence's first `num_tokens` tokens. A manager may
    return a subclass that also says where the match ends in its own index."""

    blocks: tuple[int, ...] = ()
    num_tokens: int = 0


@dataclass(frozen=True)
class SharedPrefix:
    """Running sequences whose block tables start with the same `num_blocks` blocks: the K/V of that prefix are the
    same bytes for all of them."""

    seqs: tuple[Sequence, ...]
    num_blocks: int


@dataclass
class PrefixCacheStats:
    """Hits of every manager, counted once per request at its first admission (a preempted request's recompute
    is no query): the scheduler records them, so every design is measured the same way."""

    requests: int = 0
    hit_requests: int = 0  # requests that reused at least one token (a per-request hit)
    queried_tokens: int = 0  # prompt tokens looked up
    hit_tokens: int = 0  # of those, served from the cache
    recent: deque = field(default_factory=lambda: deque(maxlen=4096))  # (seq_id, prompt tokens, hit tokens)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def record(self, seq: Sequence) -> None:
        hit = seq.num_cached_tokens
        self.requests += 1
        self.hit_requests += hit > 0
        self.queried_tokens += seq.num_prompt_tokens
        self.hit_tokens += hit
        self.recent.append((seq.seq_id, seq.num_prompt_tokens, hit))


class CacheManager(ABC):
    """KV memory as the scheduler sees it: a BlockManager over the pool's blocks (`geometry`), and the sequences
    that hold some of them (`holders`, by id). `pool` is where the blocks' K/V live: the engine gives it, and only
    a manager that copies K/V (chapter 5's host tier) looks at it; bookkeeping alone runs without one."""

    block_manager: BlockManager
    design: str  # a short name for benches and options: "none", "hash", "radix", "bridge"

    def __init__(self, geometry: PoolGeometry, pool: KVPool | None = None) -> None:
        self.geometry, self.pool = geometry, pool
        self.holders: dict[int, Sequence] = {}
        self.stats = PrefixCacheStats()

    @property
    def block_size(self) -> int:
        return self.geometry.block_size

    @property
    def num_blocks(self) -> int:
        return self.geometry.num_blocks

    def blocks_needed(self, seq: Sequence, num_new_tokens: int, match: PrefixMatch | None = None) -> int:
        """New blocks that `num_new_tokens` more tokens of `seq` need: on admission the match's blocks are
        shared, not allocated, and its tokens are already computed. One formula for every manager."""
        # BEGIN SOLUTION task2.allocate_slots points=3
        shared = len(match.blocks) if match else 0
        computed = match.num_tokens if match and seq.seq_id not in self.holders else seq.num_computed_tokens
        return max(0, cdiv(computed + num_new_tokens, self.block_size) - len(seq.block_table) - shared)
        # END SOLUTION

    @abstractmethod
    def new_sequence(self, seq_id: int, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        """A new request as this manager tracks it (a manager may accept extra per-request keywords)."""

    @abstractmethod
    def get_computed_blocks(self, seq: Sequence) -> PrefixMatch:
        """The longest cached prefix of a waiting sequence (never all of it: the last token's logits are
        needed). Looks only: nothing is held until `allocate_slots` takes the match back."""

    @abstractmethod
    def allocate_slots(self, seq: Sequence, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Make room for `num_new_tokens` more tokens of `seq`; on admission, `match` (from
        `get_computed_blocks`) is shared first. All or nothing: False means nothing changed."""

    @abstractmethod
    def on_computed(self, seq: Sequence) -> None:
        """Called after each forward that advanced `seq`."""

    @abstractmethod
    def free(self, seq: Sequence) -> None:
        """Drop everything `seq` holds (finish, abort or preemption)."""

    @abstractmethod
    def num_held_blocks(self) -> int:
        """Blocks that live requests hold (a shared block once; a cache's unused blocks are reclaimable, so not
        counted). O(1): the engine asks after every step."""

    def slot_usage(self) -> tuple[int, int]:
        """(allocated, filled) slots held for live requests. Every block a request shares is full, so the
        unfilled slots are each request's own: the tail of its table past its computed tokens. O(requests)."""
        allocated = self.num_held_blocks() * self.block_size
        unfilled = sum(len(s.block_table) * self.block_size - s.num_computed_tokens for s in self.holders.values())
        return allocated, allocated - unfilled

    def reset_cache(self) -> int:
        """Forget every cached prefix (e.g. after a weight update); returns the blocks dropped. Paging alone
        caches nothing."""
        return 0

    def shared_prefixes(self, seqs: list[Sequence], min_blocks: int = 1) -> list[SharedPrefix]:
        """Groups of `seqs` (running sequences) that share at least `min_blocks` leading blocks, each sequence in one
        group at most, from what the manager already counts. Paging alone shares nothing."""
        return []

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise AssertionError naming the broken invariant."""
