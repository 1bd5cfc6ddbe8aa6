"""Where the course is, where converted weights and tokenizers are cached (never in git), and how a path is shown."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """$KVCOURSE_CACHE, else ~/.cache/kvcourse. Created on demand."""
    path = Path(os.environ.get("KVCOURSE_CACHE", Path.home() / ".cache" / "kvcourse"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def shown(path: Path) -> str:
    """A path relative to the working directory when it is below it (shorter to read), else as it is."""
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd()))
    return str(path)
