"""RoPE: a rotation (norms kept) whose q·k depends only on the distance between positions."""
from __future__ import annotations

import pytest
import torch

from step01_kvcache.rope import RotaryEmbedding, apply_rotary


@pytest.mark.task("task1.rope")
def test_rope_preserves_norm_and_position_zero_is_identity():
    rope = RotaryEmbedding(16, 64, 10000.0)
    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    rq, rk = apply_rotary(q, k, *rope(torch.arange(5), q.dtype))
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(rk.norm(dim=-1), k.norm(dim=-1))
    torch.testing.assert_close(rq[0], q[0])


@pytest.mark.task("task1.rope")
def test_rope_scores_depend_on_relative_position_only():
    rope = RotaryEmbedding(16, 64, 10000.0)
    q, k = torch.randn(1, 1, 16), torch.randn(1, 1, 16)

    def score(m: int, n: int) -> float:
        rq, _ = apply_rotary(q, k, *rope(torch.tensor([m]), q.dtype))
        _, rk = apply_rotary(q, k, *rope(torch.tensor([n]), q.dtype))
        return float((rq * rk).sum())

    assert score(7, 3) == pytest.approx(score(30, 26), abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-4)
