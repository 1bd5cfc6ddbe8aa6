"""The fused step that CUDA graphs capture (fusion.py), checked on the CPU: q/k/v as one product and gate/up as
another give the same hidden states as chapter 1's three and two products, with fewer matrix products, and
chapter 1's modules come back untouched afterwards."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from step01_kvcache.tiny import tiny_model
from step06_triton.fusion import fused_decode


@pytest.fixture
def model():
    return tiny_model(seed=4, num_layers=2, num_heads=6, num_kv_heads=2)


def products(model, ids, positions) -> tuple[torch.Tensor, int]:
    """The hidden states, and how many times F.linear ran (every projection and the fused ones)."""
    calls = []
    linear = F.linear

    def counted(*args, **kwargs):
        calls.append(1)
        return linear(*args, **kwargs)

    F.linear = counted
    try:
        return model(ids, positions), len(calls)
    finally:
        F.linear = linear


@pytest.mark.task("task6.fuse")
def test_fused_step_gives_the_same_hidden_states_with_fewer_products(model):
    ids, positions = torch.randint(0, 256, (7,)), torch.arange(7)
    plain, plain_products = products(model, ids, positions)
    with fused_decode(model, compile_pointwise=False) as keep:
        fused, fused_products = products(model, ids, positions)
        assert len(keep) == 2 + 2 * len(model.layers), "a fused weight per projection group, kept for the graphs"
    torch.testing.assert_close(fused, plain)
    assert plain_products == 7 * len(model.layers) and fused_products == 4 * len(model.layers)


@pytest.mark.task("task6.fuse")
def test_chapter_1s_modules_come_back(model):
    ids, positions = torch.randint(0, 256, (5,)), torch.arange(5)
    before = model(ids, positions)
    with fused_decode(model, compile_pointwise=False):
        attn = model.layers[0].self_attn
        assert attn.q_proj is not attn._modules["q_proj"]
    assert isinstance(model.layers[0].self_attn.q_proj, torch.nn.Linear)
    assert torch.equal(model(ids, positions), before)
