"""The shape of a Llama-architecture model: every size the code needs, in one frozen record."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of a Llama-style decoder. SmolLM2-135M: 30 layers, 9 query heads, 3 KV heads, head_dim 64."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads}): "
                "grouped-query attention shares each KV head among a whole group of query heads")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA). 1 is plain multi-head attention."""
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """K and V, every layer: what one cached token costs."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes
