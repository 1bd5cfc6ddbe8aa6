"""EngineConfig: the pool's geometry and dtype, the scheduler's budget and speculative decoding's drafts, each field
checked here and nowhere else (the geometry's two fields by `PoolGeometry`, which the engine hands to the pool and the
cache manager; the static scales' shape by the pool, which knows the model)."""
from __future__ import annotations

from dataclasses import dataclass

from .fp8_pool import KV_CACHE_DTYPES, KVScales
from .geometry import PoolGeometry, check_positive_int


@dataclass(frozen=True)
class EngineConfig:
    num_blocks: int = 256  # pool size in blocks
    block_size: int = 16  # tokens per block
    max_num_seqs: int = 8  # seats: sequences running at once
    max_num_batched_tokens: int = 512  # token budget of one step
    enable_chunked_prefill: bool = True  # a long prompt runs in budget-sized chunks
    kv_cache_dtype: str = "auto"  # "auto": K/V in the model's dtype; "fp8_e4m3": one byte per element (fp8_pool.py)
    kv_scales: KVScales | None = None  # fp8 only: static scales (calibrated); None: dynamic, per token and head
    num_speculative_tokens: int = 0  # drafts verified per decode step (0: no speculative decoding)
    prompt_lookup_min: int = 2  # the shortest suffix the prompt-lookup proposer matches (ngram_proposer.py)
    prompt_lookup_max: int = 4  # and the longest

    def __post_init__(self) -> None:
        self.geometry  # noqa: B018 (checks num_blocks and block_size)
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(f"enable_chunked_prefill must be a bool, got {self.enable_chunked_prefill!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.kv_scales is not None and (self.kv_cache_dtype == "auto" or not isinstance(self.kv_scales, KVScales)):
            raise ValueError("kv_scales must be a KVScales, for kv_cache_dtype='fp8_e4m3' only; got "
                             f"{type(self.kv_scales).__name__} with {self.kv_cache_dtype!r}")
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
