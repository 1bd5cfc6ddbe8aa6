"""Seeded tiny random models of the same architecture, for fast tests."""
from __future__ import annotations

import torch

from .config import ModelConfig
from .model import Transformer

# SmolLM2-135M-Instruct's architecture (as its GGUF file declares it; a slow test checks): random weights of this
# shape stand in for the real ones where the weights cannot travel (the GPU machine of chapter 6).
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                    num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                    tie_word_embeddings=True)


def tiny_config(num_heads: int = 4, num_kv_heads: int = 2, **overrides) -> ModelConfig:
    """A 2-layer Llama with GQA (4 query heads over 2 KV heads by default) and a 256-token vocabulary."""
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=num_heads,
                num_kv_heads=num_kv_heads, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5,
                max_position_embeddings=512, tie_word_embeddings=True)
    base.update(overrides)
    return ModelConfig(**base)


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    """Random weights (std 0.2 so that attention is far from uniform and bugs show), eval mode, fp32."""
    cfg = tiny_config(**overrides)
    gen = torch.Generator().manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()
