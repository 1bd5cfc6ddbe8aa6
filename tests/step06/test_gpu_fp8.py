"""The FP8 pool on a GPU (run there: `pytest tests/step06 -k fp8`; skipped on a CPU): bf16 queries over fp8 bytes at a
Llama-3-8B layer's shape, a captured decode replayed with new lengths, and the engine's fp8 tokens with CUDA graphs
(fused, overlapped, cascade) equal to the torch path's in fp32. tests/step06/test_fp8_kernels.py runs compiled there
too: the store's bytes against PyTorch's rounding, through `cvt.rn.satfinite`."""
from __future__ import annotations

import pytest
import torch

from step01_kvcache.tiny import tiny_model
from step06_triton.decode_attention import num_kv_splits, paged_decode_attention
from step06_triton.engine import make_engine
from step06_triton.extend_attention import extend_attention
from tests.driver import drive_to_end, shared_prompts
from tests.step06.test_fp8_kernels import FP8Pool
from tests.step06.test_kernels import reference_decode, reference_extend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled kernels, graphs)")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("scales", ["token", "layer"])
def test_bf16_queries_over_an_fp8_pool_at_llama_shapes(scales):
    lengths = [1, 300, 1000, 2049]
    pool = FP8Pool(lengths, 16, num_kv_heads=8, head_dim=128, seed=1, scales=scales)
    q = torch.randn(4, 32, 128, device="cuda", dtype=torch.bfloat16)
    out = paged_decode_attention(q, pool.k8, pool.v8, pool.block_table, pool.seq_lens, num_kv_splits(max(lengths)),
                                 kv_scales=pool.scales)
    assert rel_err(out, reference_decode(pool, q)) < 1e-2
    q_lens = [1, 100, 1000, 49]
    qx = torch.randn(sum(q_lens), 32, 128, device="cuda", dtype=torch.bfloat16)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out = extend_attention(qx, pool.k8, pool.v8, pool.block_table, qsl, pool.seq_lens, max(q_lens),
                           kv_scales=pool.scales)
    assert rel_err(out, reference_extend(pool, qx, q_lens)) < 1e-2


def test_a_captured_fp8_decode_replays_new_lengths():
    pool = FP8Pool([4096] * 8, 16, num_kv_heads=3, head_dim=64, seed=2)
    q = torch.randn(8, 9, 64, device="cuda", dtype=torch.bfloat16)
    seq_lens = pool.seq_lens.clone()
    out = torch.empty_like(q)
    run = lambda: paged_decode_attention(q, pool.k8, pool.v8, pool.block_table, seq_lens,  # noqa: E731
                                         num_kv_splits(4096), out=out, kv_scales=pool.scales)
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for lengths in ([4096] * 8, [1] * 7 + [4096], [3000, 17, 2, 4096, 900, 1, 64, 65]):
        seq_lens.copy_(torch.tensor(lengths))
        pool.lengths = lengths
        out.fill_(float("nan"))
        graph.replay()
        assert rel_err(out, reference_decode(pool, q)) < 1e-2, lengths


@pytest.mark.parametrize("options", [dict(cuda_graphs=True), dict(cuda_graphs=True, fuse=True, overlap=True),
                                     dict(cuda_graphs=True, cascade=True, cascade_min_tokens=16, cascade_min_seqs=2)])
def test_the_engines_fp8_tokens_on_the_gpu_are_the_torch_paths(options, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # exact fp32 products, this test only
    model = tiny_model(seed=3, num_heads=6, num_kv_heads=2).cuda()
    prompts = shared_prompts(9, seed=5)
    outs, dtypes = {}, []
    for name, backend, extra in (("torch", "torch", {}), ("triton", "triton", options)):
        engine = make_engine(model, "bridge", backend, num_blocks=256, block_size=16, max_num_seqs=6,
                             max_num_batched_tokens=64, kv_cache_dtype="fp8_e4m3", **extra)
        outs[name] = [o.output_ids for o in drive_to_end(engine, prompts)]
        dtypes.append(engine.pool.k.dtype)
    assert outs["triton"] == outs["torch"] and dtypes == [torch.float8_e4m3fn] * 2
