"""Shared fixtures: tiny seeded models for speed, the real SmolLM2 (session-scoped) for `slow` tests. Without a
CUDA GPU, chapter 6's kernels run through Triton's interpreter, switched on here, where the test process starts,
before anything imports triton."""
from __future__ import annotations

import pytest
import torch

from course.tiny import tiny_model
from step06_triton.interpreter import use_interpreter_without_gpu

use_interpreter_without_gpu()


@pytest.fixture
def tiny():
    return tiny_model(seed=0)


@pytest.fixture(scope="session")
def real_model():
    from course.pretrained import load_model

    return load_model()


@pytest.fixture(scope="session")
def tokenizer():
    from course.pretrained import load_tokenizer

    return load_tokenizer()


_CORES = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _threads_and_seed(request):
    """Tiny models run on one thread: thread start-up and barriers cost more than their matmuls, and a busy
    machine makes multi-threaded tiny ops very slow. Real-model tests get every core."""
    torch.set_num_threads(_CORES if "real_model" in request.fixturenames else 1)
    torch.manual_seed(0)
