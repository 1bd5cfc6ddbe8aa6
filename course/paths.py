"""Where converted weights and tokenizers are cached (never in git)."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """$KVCOURSE_CACHE, else ~/.cache/kvcourse. Created on demand."""
    path = Path(os.environ.get("KVCOURSE_CACHE", Path.home() / ".cache" / "kvcourse"))
    path.mkdir(parents=True, exist_ok=True)
    return path
