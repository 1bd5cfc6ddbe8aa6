"""EngineConfig: the pool's geometry and the scheduler's budget, each field checked here and nowhere else (the
geometry's two fields by `PoolGeometry`, which the engine hands to the pool and the cache manager). The pool's
element type is the pool's own choice (the engine's `pool` seam, kv_pool.py); speculative decoding's settings are its
own engine's (chapter 5's `SpeculativeConfig`)."""
from __future__ import annotations

from dataclasses import dataclass

from .geometry import PoolGeometry, check_positive_int


@dataclass(frozen=True)
class EngineConfig:
    num_blocks: int = 256  # pool size in blocks
    block_size: int = 16  # tokens per block
    max_num_seqs: int = 8  # seats: sequences running at once
    max_num_batched_tokens: int = 512  # token budget of one step
    enable_chunked_prefill: bool = True  # a long prompt runs in budget-sized chunks

    def __post_init__(self) -> None:
        self.geometry  # noqa: B018 (checks num_blocks and block_size)
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(f"enable_chunked_prefill must be a bool, got {self.enable_chunked_prefill!r}")

    @property
    def geometry(self) -> PoolGeometry:
        return PoolGeometry(self.num_blocks, self.block_size)
