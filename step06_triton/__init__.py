"""Chapter 6: the paged engine's attention as Triton kernels (store, split-KV decode, prefill with prefix).

Without a CUDA GPU the kernels run through Triton's interpreter (numpy, on the CPU): slow but exact, which is
how the tests check them here. The switch must be set before any kernel is defined, so it lives here.
"""
import os

import torch

INTERPRETED = not torch.cuda.is_available()
if INTERPRETED:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from .engine import make_engine  # noqa: E402 - after the interpreter switch, which must precede every kernel

__all__ = ["INTERPRETED", "make_engine"]
