"""Compiled kernels and CUDA graphs: run on a GPU machine (`pytest tests/step06` there), skipped on a CPU.

bf16 is the dtype the kernels are built for and the one the interpreter cannot check; a decode launch captured
in a CUDA graph must follow new lengths at replay; CUDA-graph replay must give the eager engine's tokens (fp32,
where two correct implementations agree exactly on argmax)."""
from __future__ import annotations

import pytest
import torch

from step06_triton.decode_attention import num_kv_splits, paged_decode_attention
from step06_triton.extend_attention import extend_attention
from tests.step06.test_kernels import Pool, reference_decode, reference_extend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled Triton kernels)")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("block_size", [1, 16])
def test_bf16_decode_and_extend_at_llama_shapes(block_size):
    lengths = [1, 300, 1000, 2049]
    pool = Pool(lengths, block_size, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16, seed=block_size)
    q = torch.randn(4, 32, 128, device="cuda", dtype=torch.bfloat16)
    out = paged_decode_attention(q, pool.k, pool.v, pool.block_table, pool.seq_lens,
                                 num_kv_splits(max(lengths)))
    assert rel_err(out, reference_decode(pool, q)) < 1e-2
    q_lens = [1, 100, 1000, 49]
    qx = torch.randn(sum(q_lens), 32, 128, device="cuda", dtype=torch.bfloat16)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out = extend_attention(qx, pool.k, pool.v, pool.block_table, qsl, pool.seq_lens, max(q_lens))
    assert rel_err(out, reference_extend(pool, qx, q_lens)) < 1e-2


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(32, 8, 128), (9, 3, 64)])
def test_decode_graph_replays_ragged_batches_with_a_fixed_grid(heads, kv_heads, head_dim):
    """Captured once with the grid for any context up to 4096 tokens, replayed with other lengths: each program
    finds its split on the device, so the replay is right for a ragged batch and for a uniform one."""
    g = torch.Generator().manual_seed(heads)
    pool = Pool([4096] * 8, 16, num_kv_heads=kv_heads, head_dim=head_dim, dtype=torch.bfloat16, seed=heads)
    q = torch.randn(8, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.full((8,), 4096, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    run = lambda: paged_decode_attention(q, pool.k, pool.v, pool.block_table, seq_lens,  # noqa: E731
                                         num_kv_splits(4096), out=out)
    run()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for lengths in ([4096] * 8, torch.randint(1, 4097, (8,), generator=g).tolist(), [1] * 7 + [4096]):
        seq_lens.copy_(torch.tensor(lengths))
        pool.lengths, pool.seq_lens = lengths, seq_lens
        out.fill_(float("nan"))
        graph.replay()
        assert rel_err(out, reference_decode(pool, q)) < 1e-2, lengths
