"""A Llama-architecture decoder written for reading. Parameter names follow Hugging Face's
`LlamaForCausalLM` (minus the `model.` prefix), so the same state dict loads into both — that is how the
tests hold our model to the Hugging Face oracle.

Tokens are a flat 1-D tensor [T] with their absolute positions [T]; there is no batch dimension. One
request in chapter 1; in chapter 2 the T tokens come from many requests at once and the KV store knows
which token belongs to which sequence.
"""
from __future__ import annotations

import torch
from torch import nn

from .attention import Attention, KVStore
from .config import ModelConfig
from .layers import MLP, RMSNorm
from .rope import RotaryEmbedding


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(layer, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv: KVStore | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Embedding, `num_layers` decoder blocks, final norm; `compute_logits` applies the LM head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: KVStore | None = None) -> torch.Tensor:
        """Hidden states [T, hidden] of T tokens at the given absolute positions."""
        x = self.embed_tokens(input_ids)
        rope = self.rope(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, positions, rope, kv)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head, applied only to the rows we sample from (the last token of a prefill, not all of it)."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return hidden @ weight.T
