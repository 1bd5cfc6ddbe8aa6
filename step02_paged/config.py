"""EngineConfig: the pool's geometry, the scheduler's budget and the engine loop's mode, each field checked here
and nowhere else. It is the one owner of `block_size`: the engine hands it to the pool and the cache manager."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    num_blocks: int = 256  # pool size in blocks
    block_size: int = 16  # tokens per block
    max_num_seqs: int = 8  # seats: sequences running at once
    max_num_batched_tokens: int = 512  # token budget of one step
    enable_chunked_prefill: bool = True  # a long prompt runs in budget-sized chunks
    overlap: bool = False  # schedule step N+1 while step N runs (SGLang's overlap scheduler; chapter 6)

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
