"""RoPE: a rotation (norms kept) whose q·k depends only on the distance between positions."""
from __future__ import annotations

import math

import pytest
import torch

from step01_kvcache.rope import RotaryEmbedding, apply_rotary


@pytest.mark.task("task1.rope")
def test_rope_preserves_norm_and_position_zero_is_identity():
    rope = RotaryEmbedding(16, 10000.0)
    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    rq, rk = apply_rotary(q, k, *rope(torch.arange(5), q.dtype))
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(rk.norm(dim=-1), k.norm(dim=-1))
    torch.testing.assert_close(rq[0], q[0])


@pytest.mark.task("task1.rope")
def test_rope_scores_depend_on_relative_position_only():
    rope = RotaryEmbedding(16, 10000.0)
    q, k = torch.randn(1, 1, 16), torch.randn(1, 1, 16)

    def score(m: int, n: int) -> float:
        rq, _ = apply_rotary(q, k, *rope(torch.tensor([m]), q.dtype))
        _, rk = apply_rotary(q, k, *rope(torch.tensor([n]), q.dtype))
        return float((rq * rk).sum())

    assert score(7, 3) == pytest.approx(score(30, 26), abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-4)


@pytest.mark.task("task1.rope")
def test_rope_angles_follow_the_frequency_of_each_pair():
    """Position p turns pair i (dimensions i and i + D/2) by p * theta^(-2i/D), in the requested dtype."""
    head_dim, theta = 8, 500.0
    cos, sin = RotaryEmbedding(head_dim, theta)(torch.tensor([0, 3, 41]), torch.float64)
    assert cos.shape == sin.shape == (3, 1, head_dim) and cos.dtype == torch.float64
    for row, p in enumerate([0, 3, 41]):
        for i in range(head_dim // 2):
            angle = p * theta ** (-2 * i / head_dim)
            for d in (i, i + head_dim // 2):
                assert cos[row, 0, d].item() == pytest.approx(math.cos(angle), abs=1e-5)
                assert sin[row, 0, d].item() == pytest.approx(math.sin(angle), abs=1e-5)
