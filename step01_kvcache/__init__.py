"""Chapter 1: a tiny Llama-style transformer and the naive contiguous KV cache."""
from .config import ModelConfig
from .generate import SamplingParams, generate, sample_next, validate_prompt
from .kv_cache import KVCache
from .model import Transformer

__all__ = ["KVCache", "ModelConfig", "SamplingParams", "Transformer", "generate", "sample_next", "validate_prompt"]
