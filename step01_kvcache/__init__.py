"""Chapter 1: a tiny Llama-style transformer and the naive contiguous KV cache."""
from .config import ModelConfig
from .generate import generate
from .kv_cache import KVCache
from .model import Transformer
from .request import SamplingParams, validate_prompt
from .sampling import sample, sample_next

__all__ = ["KVCache", "ModelConfig", "SamplingParams", "Transformer", "generate", "sample", "sample_next",
           "validate_prompt"]
