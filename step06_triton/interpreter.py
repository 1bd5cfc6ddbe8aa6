"""Triton's interpreter, for machines without a CUDA GPU: every kernel program runs as numpy code, exact and slow.

Triton reads its switch, TRITON_INTERPRET=1, when it is imported and when a kernel is defined, and more than the
kernels import it (`transformers` does). So the switch is thrown once, where a process starts, before anything
imports triton: `python -m step06_triton`, the notebook's first cell and the tests' conftest call
`use_interpreter_without_gpu()` first. Importing the chapter changes nothing.

One conversion is fixed on the way. The interpreter reads float8_e4m3 exactly (every one of its 256 values), but
rounds to it wrongly (Triton 3.9): it adds the first dropped bit to the 3-bit mantissa without carrying it into
the exponent, so a value whose mantissa rounds over loses half its size when its exponent field is odd (7.9 becomes
4), a tie rounds up instead of to even, and a value beyond 448 becomes NaN. The GPU rounds to nearest even and
saturates (`cvt.rn.satfinite.e4m3x2.f32`), as PyTorch's conversion does; `use_interpreter_without_gpu` routes that
one conversion through PyTorch, so that the FP8 store kernel can be checked on a CPU byte for byte.
"""
from __future__ import annotations

import importlib.util
import os

import torch


def use_interpreter_without_gpu() -> bool:
    """Without a CUDA GPU, run the kernels through Triton's interpreter (a TRITON_INTERPRET already set is kept).
    Call it before triton is imported; returns whether the kernels are interpreted."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if interpreted and importlib.util.find_spec("triton") is not None:
        round_to_fp8_as_the_gpu_does()
    return interpreted


def round_to_fp8_as_the_gpu_does() -> None:
    """Make the interpreter's float -> float8_e4m3 conversion PyTorch's (to nearest even, saturating); idempotent."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    convert = interpreter._convert_float
    if getattr(convert, "rounds_like_the_gpu", False):
        return

    def to_e4m3(input, input_dtype, output_dtype, rounding_mode):  # noqa: A002 - the interpreter's own names
        if output_dtype != tl.float8e4nv or input_dtype not in (tl.float32, tl.float16, tl.bfloat16):
            return convert(input, input_dtype, output_dtype, rounding_mode)
        data = np.ascontiguousarray(input)  # float32 and float16 as themselves, bfloat16 as its 16 bits
        x = torch.from_numpy(data.view(np.int16)).view(torch.bfloat16) if input_dtype == tl.bfloat16 else \
            torch.from_numpy(data)
        return x.float().clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).numpy()

    to_e4m3.rounds_like_the_gpu = True
    to_e4m3.stock = convert  # Triton's own, for the test that says what it gets wrong
    interpreter._convert_float = to_e4m3
