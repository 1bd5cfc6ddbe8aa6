"""Triton's interpreter, for machines without a CUDA GPU: every kernel program runs as numpy code, exact and slow.

Triton reads its switch, TRITON_INTERPRET=1, when it is imported and when a kernel is defined, and more than the
kernels import it (`transformers` does). So the switch is thrown once, where a process starts, before anything
imports triton: `python -m step06_triton`, the notebook's first cell and the tests' conftest call
`use_interpreter_without_gpu()` first. Importing the chapter changes nothing.
"""
from __future__ import annotations

import os

import torch


def use_interpreter_without_gpu() -> bool:
    """Without a CUDA GPU, run the kernels through Triton's interpreter (a TRITON_INTERPRET already set is kept).
    Call it before triton is imported; returns whether the kernels are interpreted."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return os.environ.get("TRITON_INTERPRET") == "1"
