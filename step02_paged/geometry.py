"""How the KV pool is cut: `num_blocks` blocks of `block_size` tokens, checked once, here.

The engine makes one `PoolGeometry` from its config and hands the same object to the pool, the cache manager and,
through the manager, to whatever else counts in blocks (a sequence's hashes, a tree's edges). Nobody checks
`block_size` again, and nobody defines a block size of their own. `cdiv` is the one arithmetic they all share;
this module imports nothing, so the kernels of chapter 6 can use it without the engine.
"""
from __future__ import annotations

from dataclasses import dataclass


def check_positive_int(name: str, value: object) -> None:
    """The one check of a count (blocks, tokens, seats): an int >= 1, and not a bool."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the blocks that `a` tokens fill when a block holds `b`."""
    return -(-a // b)


@dataclass(frozen=True)
class PoolGeometry:
    num_blocks: int  # blocks in the pool
    block_size: int  # tokens per block (1: SGLang's token-level pool, one slot per token)

    def __post_init__(self) -> None:
        check_positive_int("num_blocks", self.num_blocks)
        check_positive_int("block_size", self.block_size)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that `num_tokens` tokens of one sequence fill."""
        return cdiv(num_tokens, self.block_size)
