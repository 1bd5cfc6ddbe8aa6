"""EngineConfig: the pool's geometry, the scheduler's budget and speculative decoding's drafts, each field
checked here and nowhere else (the geometry's two fields by `PoolGeometry`, which the engine hands to the pool and the
cache manager). The pool's element type is the pool's own choice (the engine's `pool` seam, kv_pool.py)."""
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
    num_speculative_tokens: int = 0  # drafts verified per decode step (0: no speculative decoding)
    prompt_lookup_min: int = 2  # the shortest suffix the prompt-lookup proposer matches (ngram_proposer.py)
    prompt_lookup_max: int = 4  # and the longest

    def __post_init__(self) -> None:
        self.geometry  # noqa: B018 (checks num_blocks and block_size)
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(f"enable_chunked_prefill must be a bool, got {self.enable_chunked_prefill!r}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(f"num_speculative_tokens must be an int >= 0 (0: no speculative decoding), got {k!r}")
        check_positive_int("prompt_lookup_min", self.prompt_lookup_min)
        check_positive_int("prompt_lookup_max", self.prompt_lookup_max)
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError(f"prompt_lookup_max ({self.prompt_lookup_max}) must be >= prompt_lookup_min "
                             f"({self.prompt_lookup_min})")

    @property
    def geometry(self) -> PoolGeometry:
        return PoolGeometry(self.num_blocks, self.block_size)
