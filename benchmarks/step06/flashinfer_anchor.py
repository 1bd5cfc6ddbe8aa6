"""`python -m benchmarks.step06.flashinfer_anchor [--out FILE]`: the chapter's kernels beside FlashInfer, the
kernel library production engines call, on the same tensors in the same run.

FlashInfer 0.5.3 is no dependency of the course: it needs CUDA and compiles its kernels on first use with the
machine's nvcc (about two minutes on an H200). Bring its wheels and install them beside the image's torch:
`flashinfer-python==0.5.3`, `apache-tvm-ffi`, `nvidia-cudnn-frontend`, `pip install --no-deps --target DIR`, then
`PYTHONPATH=DIR`. Without it this command says so and exits 2.

- `decode`: every decode row of the chapter's kernel table (measure/kernels.py's `decode_table_rows`: uniform
  batches with 32/8 x 128 heads, the ragged batch of 64 contexts from 1..8,192 tokens with both head shapes, blocks
  of 16 and of 1 scattered over the pool), bf16. FlashInfer's `BatchDecodeWithPagedKVCacheWrapper` reads the very
  pool the course's kernel reads (its "NHD" layout is chapter 2's [blocks, block_size, H_kv, D]), through the same
  block tables turned into its page lists, with each of its two decode kernels (CUDA cores, its default; tensor
  cores, which SGLang and vLLM choose for grouped heads): the better is the anchor. Two ways to launch, each for
  both: replayed from a CUDA graph (FlashInfer's wrapper built for graphs, planned once), and eager as an engine
  launches a step, planning included (FlashInfer plans on the host; the course's kernel plans on the device), with
  the course's merge slots allocated once as an engine does. An engine plans FlashInfer once per step and reuses
  the plan for every layer, so the eager figures, a plan per call, bound the course's lead from above; the fairer
  anchor, `eager_per_layer`, plans once and runs the head shape's model's layers (16 for Llama-3.2-1B's 32/8 x 128,
  30 for SmolLM2's 9/3 x 64), each side reported per call.
- `prefill`: prefill after a cached prefix, (4 x (4,096 cached + 2,048 new)) and the ragged prefill of
  measure/kernels.py, 32/8 x 128: `BatchPrefillWithPagedKVCacheWrapper`, causal (the mask aligned to the end of
  each context), against the course's extend kernel, TFLOP/s over the visible query-key pairs, graph replays.
Every contender is checked against an fp32 reference before it is timed.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from pathlib import Path

import torch

from step02_paged.geometry import cdiv
from step06_triton.decode_attention import Partials, num_kv_splits, paged_decode_attention
from step06_triton.extend_attention import extend_attention

from . import kernels
from .common import Parts, checked, eager_ms, median_ms, needs_gpu

BLOCK = 16
WORKSPACE = 256 * 2**20  # bytes of FlashInfer's float workspace (its examples use 128 MiB)


LAYERS = {kernels.LLAMA: 16, kernels.SMOLLM2: 30}  # the decoder layers of the model each head shape comes from


def page_lists(table: torch.Tensor, lengths: list[int], block_size: int) -> tuple[torch.Tensor, ...]:
    """A block table as FlashInfer's page lists, int32: (indptr [B + 1] on the host, indices [pages in use] on the
    table's device, last_page_len [B] on the host), as an engine hands them to FlashInfer's `plan`, which reads
    the lengths on the host. Sequence b's pages are indices[indptr[b]:indptr[b + 1]], the last one holding
    last_page_len[b] tokens (1..block_size)."""
    pages = [cdiv(n, block_size) for n in lengths]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    width = torch.arange(table.shape[1], device=table.device)
    used = width[None, :] < torch.tensor(pages, device=table.device)[:, None]
    last = torch.tensor([(n - 1) % block_size + 1 for n in lengths], dtype=torch.int32)
    return indptr, table[used].to(torch.int32).contiguous(), last


def decode_row(flashinfer, heads: str, lengths: list[int], spare: float, block_size: int) -> dict:
    """One decode row of the kernel table: FlashInfer's two decode kernels (CUDA cores, the default, and tensor
    cores, which SGLang and vLLM pick for grouped heads) and the course's, each as a CUDA-graph replay, eager with a
    plan per call, and eager per layer (`eager_per_layer`: one plan, then a model's layers of calls, the time over
    the layers); FlashInfer's better kernel is the anchor of each mode."""
    hq, hkv, d = kernels.HEADS[heads]
    layers = LAYERS[heads]
    x = kernels.decode_batch(heads, lengths, block_size, spare)
    k, v, table, q, seq_lens, nbytes = (x[key] for key in ("k", "v", "table", "q", "seq_lens", "bytes"))
    tb_s = lambda ms: round(nbytes / ms / 1e9, 3)  # noqa: E731
    ref = kernels.decode_reference(q, k, v, table, lengths, block_size)
    indptr, indices, last = page_lists(table, lengths, block_size)
    plan = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=block_size, q_data_type=torch.bfloat16,
                kv_data_type=torch.bfloat16)
    row: dict = dict(heads=heads, ragged=len(set(lengths)) > 1, batch=len(lengths), context=max(lengths),
                     block_size=block_size, total_tokens=sum(lengths), bytes=nbytes)
    fi_out = torch.empty_like(q)
    for kernel, tensor_cores in (("cuda_cores", False), ("tensor_cores", True)):
        # CUDA-graph replays: FlashInfer's wrapper for graphs, planned once
        graphed = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"), "NHD", use_cuda_graph=True,
            use_tensor_cores=tensor_cores, paged_kv_indptr_buffer=indptr.cuda(),
            paged_kv_indices_buffer=indices.clone(), paged_kv_last_page_len_buffer=last.cuda())
        graphed.plan(indptr, indices, last, **plan)
        fi = lambda graphed=graphed: graphed.run(q, (k, v), out=fi_out)  # noqa: E731
        checked(fi(), ref, f"FlashInfer decode ({kernel}) {heads}")
        row[f"flashinfer_{kernel}_graph_tb_s"] = tb_s(median_ms(fi))
        # eager, as an engine launches a step: FlashInfer plans on the host each step, then runs
        eager = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"), "NHD", use_tensor_cores=tensor_cores)

        def fi_step(eager=eager):
            eager.plan(indptr, indices, last, **plan)
            return eager.run(q, (k, v), out=fi_out)
        checked(fi_step(), ref, f"FlashInfer decode ({kernel}) {heads}, eager")
        row[f"flashinfer_{kernel}_eager_tb_s"] = tb_s(eager_ms(fi_step))

        def fi_layers(eager=eager, layers=layers):  # as an engine runs a step: one plan, every layer runs on it
            eager.plan(indptr, indices, last, **plan)
            for _ in range(layers):
                eager.run(q, (k, v), out=fi_out)
        row[f"flashinfer_{kernel}_eager_per_layer_tb_s"] = tb_s(eager_ms(fi_layers) / layers)
    # the course's kernel: replayed on the eager axis, and eager with its merge slots allocated once, as an engine does
    splits = num_kv_splits(max(lengths))
    ours = functools.partial(paged_decode_attention, q, k, v, table, seq_lens, splits)
    row["triton_rel_err"] = checked(ours(), ref, f"decode {heads}")
    row["triton_graph_tb_s"] = tb_s(median_ms(ours))
    out, partials = torch.empty_like(q), Partials.empty(len(lengths), hq, d, splits, q.device)
    ours_step = functools.partial(paged_decode_attention, q, k, v, table, seq_lens, splits, out, partials)
    checked(ours_step(), ref, f"decode {heads}, eager")
    row["triton_eager_tb_s"] = tb_s(eager_ms(ours_step))

    def ours_layers():
        for _ in range(layers):
            ours_step()
    row["triton_eager_per_layer_tb_s"] = tb_s(eager_ms(ours_layers) / layers)
    for mode in ("graph", "eager", "eager_per_layer"):
        best = max(row[f"flashinfer_{kernel}_{mode}_tb_s"] for kernel in ("cuda_cores", "tensor_cores"))
        row[f"flashinfer_{mode}_tb_s"] = best
        row[f"{mode}_vs_flashinfer"] = round(row[f"triton_{mode}_tb_s"] / best, 3)
    return row


def prefill_row(flashinfer, prefixes: list[int], news: list[int]) -> dict:
    x = kernels.extend_inputs(prefixes, news, BLOCK)
    q, k, v, table, ctx, hq, hkv, d = x["q"], x["k"], x["v"], x["table"], x["ctx"], x["hq"], x["hkv"], x["d"]
    tflop_s = lambda ms: round(x["flops"] / ms / 1e9, 1)  # noqa: E731
    ours = functools.partial(extend_attention, q, k, v, table, x["qsl"], x["seq_lens"], max(news))
    indptr, indices, last = page_lists(table, ctx, BLOCK)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"), "NHD", use_cuda_graph=True,
        qo_indptr_buf=x["qsl"].clone(), paged_kv_indptr_buf=indptr.cuda(), paged_kv_indices_buf=indices.clone(),
        paged_kv_last_page_len_buf=last.cuda())
    wrapper.plan(x["qsl"].cpu(), indptr, indices, last, hq, hkv, d, BLOCK, causal=True, q_data_type=torch.bfloat16,
                 kv_data_type=torch.bfloat16)
    fi_out = torch.empty_like(q)
    fi = lambda: wrapper.run(q, (k, v), out=fi_out)  # noqa: E731
    row = dict(batch=len(news), prefixes=prefixes, news=news, flops=x["flops"],
               flashinfer_rel_err=kernels.check_prefill(fi(), x, k, v, "FlashInfer prefill", BLOCK),
               triton_rel_err=kernels.check_prefill(ours(), x, k, v, "extend", BLOCK))
    row["flashinfer_tflop_s"] = tflop_s(median_ms(fi))
    row["triton_tflop_s"] = tflop_s(median_ms(ours))
    row["vs_flashinfer"] = round(row["triton_tflop_s"] / row["flashinfer_tflop_s"], 3)
    return row


def goals(res: dict) -> list[dict]:
    """The chapter's targets against FlashInfer, met or missed, from whatever parts ran: the ragged batch in blocks
    of 16 (the batch an engine decodes) in both modes, and prefill after a cached prefix."""
    rows = []
    for r in res.get("decode", {}).values():
        if r["ragged"] and r["block_size"] == BLOCK:
            for mode in ("graph", "eager"):
                rows.append(dict(goal=f"decode ragged {r['heads']}, {mode}: >= FlashInfer's TB/s",
                                 measured=r[f"{mode}_vs_flashinfer"], met=r[f"{mode}_vs_flashinfer"] >= 1.0))
    pre = res.get("prefill", {}).get("uniform", {})
    if "vs_flashinfer" in pre:
        shape = "{} x ({:,} cached + {:,} new), ".format(*kernels.PREFILL_SHAPE) + kernels.LLAMA.replace("x", " x ")
        rows.append(dict(goal=f"prefill {shape}: >= FlashInfer's TFLOP/s",
                         measured=pre["vs_flashinfer"], met=pre["vs_flashinfer"] >= 1.0))
    return rows


def row_key(heads: str, ragged: bool, batch: int, context: int, block_size: int) -> str:
    """Where a decode row is in the JSON: what the kernel table's row says about it."""
    return f"{heads} {'ragged' if ragged else 'uniform'} {batch}x{context} block {block_size}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the JSON here (step06_triton/results/h200_flashinfer.json)")
    ap.add_argument("--parts", nargs="+", default=["decode", "prefill"], choices=["decode", "prefill"])
    args = ap.parse_args(argv)
    if not needs_gpu("benchmarks.step06.flashinfer_anchor"):
        return 2
    if importlib.util.find_spec("flashinfer") is None:
        print("FlashInfer is not installed: see this module's docstring for its wheels", file=sys.stderr)
        return 2
    import flashinfer
    parts = Parts(args.out, "python -m benchmarks.step06.flashinfer_anchor " + " ".join(argv or sys.argv[1:]),
                  keep=args.parts != ap.get_default("parts"))
    parts.result["flashinfer"] = flashinfer.__version__
    if "decode" in args.parts:
        for heads, lengths, spare, block_size in kernels.decode_table_rows():
            key = row_key(heads, len(set(lengths)) > 1, len(lengths), max(lengths), block_size)
            parts.run(("decode", key), functools.partial(decode_row, flashinfer, heads, lengths, spare, block_size))
            torch.cuda.empty_cache()
    if "prefill" in args.parts:
        batch, prefix, new = kernels.PREFILL_SHAPE
        parts.run(("prefill", "uniform"), functools.partial(prefill_row, flashinfer, [prefix] * batch, [new] * batch))
        parts.run(("prefill", "ragged"), functools.partial(prefill_row, flashinfer, *kernels.ragged_prefill_shape()))
    parts.finish(goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
