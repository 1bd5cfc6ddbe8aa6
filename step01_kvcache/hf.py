"""Translation between our ModelConfig / state dict and Hugging Face's Llama classes (the oracle)."""
from __future__ import annotations

import torch

from .config import ModelConfig
from .model import Transformer


def to_hf_config(cfg: ModelConfig):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings, hidden_act="silu", attention_bias=False,
        mlp_bias=False, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )


def from_hf_config(hf: dict) -> ModelConfig:
    """From a checkpoint's config.json (a Llama-family model)."""
    if hf.get("rope_scaling"):
        raise ValueError(f"rope_scaling {hf['rope_scaling']!r} is not supported by the course model")
    heads = hf["num_attention_heads"]
    return ModelConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=float(hf.get("rope_theta", 10000.0)), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
    )


def to_hf_model(model: Transformer, attn_implementation: str = "eager"):
    """A `LlamaForCausalLM` holding exactly our weights, in our dtype, on our device. Eager attention is the
    logits oracle (plain matmuls); "sdpa" is Hugging Face's default, the fair baseline for timings."""
    from transformers import LlamaForCausalLM

    hf_cfg = to_hf_config(model.config)
    hf_cfg._attn_implementation = attn_implementation
    hf = LlamaForCausalLM(hf_cfg).to(device=model.device, dtype=model.dtype).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model.state_dict()), strict=False)
    allowed = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    if set(missing) - allowed or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if model.config.tie_word_embeddings:
        hf.tie_weights()
    return hf


def to_hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {(k if k.startswith("lm_head") else "model." + k): v for k, v in state.items()}


def from_hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k.removeprefix("model."): v for k, v in state.items() if "rotary_emb" not in k}
