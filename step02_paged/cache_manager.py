"""The cache-manager interface: the one object the scheduler and the engine ask about KV memory.

Paging alone (this chapter's KVCacheManager) or a cache that finds prompts again: every design answers the
same questions (vLLM v1's KVCacheManager and SGLang's cache classes ask them too), so the scheduler and the
engine are written once, against this class:

    seq = kv.new_sequence(...)                   a request, as this manager needs to see it
    match = kv.get_computed_blocks(seq)          what of its prompt is already in the pool? (looks only)
    kv.allocate_slots(seq, n, match)             room for n more tokens, the match's blocks shared first
    kv.on_computed(seq)                          a forward wrote more K/V: publish what others may reuse
    kv.free(seq)                                 finish, abort or preemption

The match is a handle: the lookup returns it and allocation takes it back, so nothing travels on the side.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from step01_kvcache.generate import SamplingParams

from .block_manager import BlockManager
from .sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class PrefixMatch:
    """What a lookup found: `blocks` hold the K/V of the sequence's first `num_tokens` tokens. A manager may
    return a subclass that also says where the match ends in its own index."""

    blocks: tuple[int, ...] = ()
    num_tokens: int = 0


class CacheManager(ABC):
    """KV memory as the scheduler sees it: a BlockManager of `block_size`-token blocks, and the sequences that
    hold some of them (`holders`, by id)."""

    block_size: int
    block_manager: BlockManager
    holders: dict[int, Sequence]

    @property
    def num_blocks(self) -> int:
        return self.block_manager.num_blocks

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
    def slot_usage(self) -> tuple[int, int]:
        """(allocated, filled) slots held for live sequences, a shared slot once: peak memory and waste."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise AssertionError naming the broken invariant."""
