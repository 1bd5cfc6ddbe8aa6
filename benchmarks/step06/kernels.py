"""`python -m benchmarks.step06.kernels [--part kernels|sweep|short|all|ncu] [--json] [--out FILE]`: the chapter's
kernels on a GPU, against what a user would pick instead, side by side in one run.

Kernels (bf16), two head shapes: 32 query / 8 KV heads of head_dim 128 (a Llama-3-8B layer) and 9 / 3 of 64
(SmolLM2-135M, the course's model):
* decode — achieved TB/s (K/V and q read, output written, over kernel time) for our split-KV kernel,
  gather-then-SDPA, FlexAttention over a paged block mask, and contiguous SDPA (no paging: the ceiling a paged
  kernel chases), against a device copy of the same bytes. Uniform batches, (batch, context) = (64, 4096),
  (256, 1024), (8, 32768) with the 32/8 heads (plus the course's torch path), and the batch an engine runs:
  64 contexts drawn uniformly from 1..8192, both head shapes, blocks scattered over a pool twice the size
  needed. Blocks of 16 and of 1. Ragged rows also time our kernel on the grid a CUDA graph captures (sized
  for any batch up to 32k tokens) and under the first version's launch rule (one split count for all);
* prefill with a cached prefix: (B 4, prefix 4096, new 2048), and a ragged batch (8 sequences, cached
  prefixes 0..8192, 16..1024 new tokens each) — TFLOP/s against FlexAttention (and SDPA where it applies);
* store_kvcache: GB/s.
`--part sweep` times the launch rule's target and the tile configurations the kernels' defaults come from;
`--part short` times the floor of the split rule (`min_split_len`) and the tile on the decode batch of an engine
step: 64 contexts of 20..1,600 tokens (the `random` workload's), both head shapes;
`--part ncu` runs the prefill kernel and FlexAttention's once each, for Nsight Compute.
The engine end to end is engine.py's (`python -m benchmarks.step06.engine`, its own JSON).

Every timing is the median of `triton.testing.do_bench` over replays of a CUDA graph of the call (CUDA events,
warm-up first, L2 flushed before each replay); every kernel is checked against an fp32 reference on fresh
random data before it is timed. Needs a CUDA GPU. With `--out`,
a part run alone replaces that part of an existing file and keeps the others.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from step01_kvcache.attention import attention
from step02_paged.geometry import cdiv
from step06_triton.decode_attention import (
    DECODE_TILE,
    Partials,
    num_kv_splits,
    paged_decode_attention,
    split_bucket,
    split_buckets,
    split_plan_host,
)
from step06_triton.extend_attention import extend_attention
from step06_triton.store_kvcache import store_kvcache

from .common import ceilings, checked, copy_bandwidth, eager_ms, machine, median_ms, needs_gpu, rel_err

HEADS = {"32/8x128": (32, 8, 128), "9/3x64": (9, 3, 64)}  # query heads, KV heads, head_dim
LLAMA, SMOLLM2 = HEADS
UNIFORM_SHAPES = [(64, 4096), (256, 1024), (8, 32768)]
RAGGED = dict(batch=64, max_context=8192, seed=0)  # contexts uniform in 1..max_context
GRAPH_CONTEXT = 32768  # the longest context the ragged rows' CUDA-graph grids are sized for
SHORT = dict(batch=64, low=20, high=1600, seed=1)  # an engine's decode step on the `random` workload
PREFILL_SHAPE = (4, 4096, 2048)  # batch, cached prefix, new tokens
RAGGED_PREFILL = dict(batch=8, max_prefix=8192, new=(16, 1024), seed=1)
# The first version of the decode kernel on the uniform rows (results/h200.json of 2026-12-01, 32/8 heads):
FIRST_VERSION_TB_S = {(64, 4096, 16): 4.116, (64, 4096, 1): 4.062, (256, 1024, 16): 3.96, (256, 1024, 1): 3.715,
                      (8, 32768, 16): 4.127, (8, 32768, 1): 4.072}
DEVICE = "cuda"


# ---- a paged pool with random block tables ----------------------------------------------------------------
def ragged_lengths(batch: int, low: int, high: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (batch,), generator=g).tolist()


def paged_pool(lengths: list[int], block_size: int, heads: int, dim: int, spare: float = 1.0,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K/V pools [num_blocks, block_size, heads, dim] of random bf16 with `spare` times the blocks the contexts
    need, and for every sequence a block table of randomly scattered physical blocks (int32, as vLLM keeps them;
    rows padded with block 0)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    need = [cdiv(n, block_size) for n in lengths]
    num_blocks = math.ceil(sum(need) * spare)
    k = torch.randn(num_blocks, block_size, heads, dim, dtype=torch.bfloat16, device=DEVICE, generator=g)
    v = torch.randn(num_blocks, block_size, heads, dim, dtype=torch.bfloat16, device=DEVICE, generator=g)
    order = torch.randperm(num_blocks, device=DEVICE, generator=g)[: sum(need)]
    table = torch.zeros(len(lengths), max(need), dtype=torch.int32, device=DEVICE)
    used = torch.arange(max(need), device=DEVICE)[None, :] < torch.tensor(need, device=DEVICE)[:, None]
    table[used] = order.to(torch.int32)
    return k, v, table


def kv_bytes(tokens: int, hkv: int, d: int, pool: str) -> int:
    """K/V bytes a decode reads for `tokens` tokens of context: 2 bytes per element in bf16, 1 in fp8, plus 4 per
    token and head for the scales of the per-token pool."""
    per_row = {"bf16": 2 * d, "fp8_token": d + 4, "fp8_static": d}[pool]
    return 2 * tokens * hkv * per_row


def decode_batch(heads: str, lengths: list[int], block_size: int = 16, spare: float = 2.0) -> dict:
    """A decode batch with `heads` over contexts of `lengths`: a bf16 pool `spare` times the size needed with each
    sequence's blocks scattered (`paged_pool`), the block tables, one bf16 query per sequence, the lengths on the
    device and the bytes a decode moves (K and V read, q read, the output written)."""
    hq, hkv, d = HEADS[heads]
    k, v, table = paged_pool(lengths, block_size, hkv, d, spare)
    q = torch.randn(len(lengths), hq, d, dtype=torch.bfloat16, device=DEVICE)
    nbytes = kv_bytes(sum(lengths), hkv, d, "bf16") + 2 * q.nbytes
    return dict(lengths=lengths, k=k, v=v, table=table, q=q, bytes=nbytes,
                seq_lens=torch.tensor(lengths, dtype=torch.int32, device=DEVICE))


def decode_table_rows() -> list[tuple[str, list[int], float, int]]:
    """The decode rows of the chapter's kernel table, (heads, context lengths, pool spare, block size): the uniform
    shapes with Llama's heads, the ragged batch with both, each in blocks of 16 and of 1."""
    rows = [(LLAMA, [context] * batch, 1.0) for batch, context in UNIFORM_SHAPES]
    rag = ragged_lengths(RAGGED["batch"], 1, RAGGED["max_context"], RAGGED["seed"])
    rows += [(heads, rag, 2.0) for heads in HEADS]
    return [(heads, lengths, spare, block_size) for heads, lengths, spare in rows for block_size in (16, 1)]


def ragged_decode_batch(heads: str, block_size: int = 16) -> dict:
    """The ragged batch an engine decodes (RAGGED: contexts drawn from 1..max_context), as `decode_batch`."""
    return decode_batch(heads, ragged_lengths(RAGGED["batch"], 1, RAGGED["max_context"], RAGGED["seed"]), block_size)


def decode_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, lengths: list[int],
                     block_size: int = 16) -> torch.Tensor:
    """fp32 decode attention of q [B, H_q, D] over each sequence's context in the pool k, v (gathered through its
    block table, the padding masked): what every decode contender is checked against."""
    gk, gv = gather_kv(k, v, context_slots(table, lengths, block_size))
    return F.scaled_dot_product_attention(q.float().unsqueeze(2), gk.float().transpose(1, 2),
                                          gv.float().transpose(1, 2), attn_mask=key_mask(lengths),
                                          enable_gqa=True).squeeze(2)


def check_prefill(out: torch.Tensor, x: dict, k: torch.Tensor, v: torch.Tensor, what: str,
                  block_size: int = 16) -> float:
    """The largest relative error of a prefill's output `out` [T, H_q, D] for `extend_inputs` (x) against fp32
    attention over each sequence's context in the pool k, v, causal with the mask aligned to the context's end;
    a wrong kernel stops the run. Every sequence of a ragged batch is checked; a uniform batch's are all alike."""
    uniform = len(set(x["ctx"])) == 1 and len(set(x["news"])) == 1
    ck, cv = (t.transpose(1, 2).contiguous() for t in gather_kv(k, v, context_slots(x["table"], x["ctx"],
                                                                                   block_size)))
    errs = []
    for i, (n, c) in enumerate(zip(x["news"][:1] if uniform else x["news"], x["ctx"])):
        rows = slice(int(x["qsl"][i]), int(x["qsl"][i]) + n)
        visible = torch.arange(c, device=DEVICE)[None, :] <= (c - n + torch.arange(n, device=DEVICE))[:, None]
        ref = F.scaled_dot_product_attention(x["q"][rows].float().transpose(0, 1)[None], ck[i: i + 1, :, :c].float(),
                                             cv[i: i + 1, :, :c].float(), attn_mask=visible, enable_gqa=True)
        errs.append(checked(out[rows].transpose(0, 1)[None], ref, f"{what}, sequence {i}"))
    return max(errs)


def context_slots(table: torch.Tensor, lengths: list[int], block_size: int) -> torch.Tensor:
    """[B, max_len] pool slot of every position (positions past a context repeat its last token)."""
    lens = torch.tensor(lengths, device=table.device)
    pos = torch.minimum(torch.arange(max(lengths), device=table.device)[None, :], lens[:, None] - 1)
    return table.long().gather(1, pos // block_size) * block_size + pos % block_size


def gather_kv(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, max_len, H_kv, D] copies of every sequence's K/V: what a kernel without paging needs first."""
    flat_k, flat_v = k.view(-1, k.shape[-2], k.shape[-1]), v.view(-1, v.shape[-2], v.shape[-1])
    return flat_k[slots], flat_v[slots]


def key_mask(lengths: list[int]) -> torch.Tensor | None:
    """[B, 1, 1, max_len] True where a padded batch has a real key; None when every context is as long."""
    if len(set(lengths)) == 1:
        return None
    lens = torch.tensor(lengths, device=DEVICE)
    return (torch.arange(max(lengths), device=DEVICE)[None, :] < lens[:, None])[:, None, None, :]


def flex_paged_decode(k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, lengths: list[int], block_size: int,
                      hq: int):
    """FlexAttention reading the pool in place: the pool is one long KV sequence [1, H_kv, num_slots, D] and the
    block mask lists, for each sequence, its physical blocks: full blocks without a mask, the partial last one
    through the mask_mod ("this slot belongs to sequence b and lies before its length")."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    B, width = table.shape
    num_blocks, _, hkv, d = k.shape
    num_slots = num_blocks * block_size
    kp, vp = (t.view(1, num_slots, hkv, d).transpose(1, 2) for t in (k, v))
    lens = torch.tensor(lengths, device=DEVICE)
    need = cdiv(lens, block_size)
    used = torch.arange(width, device=DEVICE)[None, :] < need[:, None]
    owner = torch.full((num_blocks,), -1, dtype=torch.long, device=DEVICE)
    logical = torch.zeros(num_blocks, dtype=torch.long, device=DEVICE)
    owner[table.long()[used]] = torch.arange(B, device=DEVICE)[:, None].expand(B, width)[used]
    logical[table.long()[used]] = torch.arange(width, device=DEVICE)[None, :].expand(B, width)[used]
    full = (lens // block_size).to(torch.int32)
    full_idx = torch.zeros(B, 1, 1, num_blocks, dtype=torch.int32, device=DEVICE)
    full_idx[..., :width] = table.view(B, 1, 1, width)
    partial = (lens % block_size > 0).to(torch.int32)
    part_idx = torch.zeros_like(full_idx)
    part_idx[:, 0, 0, 0] = table.gather(1, full.long().clamp(max=width - 1)[:, None])[:, 0]

    def in_sequence(b, h, q_idx, kv_idx):
        blk = kv_idx // block_size
        return (owner[blk] == b) & (logical[blk] * block_size + kv_idx % block_size < lens[b])
    mask = BlockMask.from_kv_blocks(partial.view(B, 1, 1), part_idx, full.view(B, 1, 1), full_idx,
                                    BLOCK_SIZE=(128, block_size), seq_lengths=(1, num_slots), mask_mod=in_sequence)
    flex = torch.compile(flex_attention, dynamic=False)
    # its default KV tile may be longer than a block (head_dim 64): then tiles of one block
    options = None if d >= 128 else dict(BLOCK_N=block_size)
    return lambda q: flex(q.view(B, hq, 1, d), kp, vp, block_mask=mask, enable_gqa=True,
                          kernel_options=options).view(B, hq, d)


def guarded(fn: Callable[[], dict]) -> dict:
    """A baseline that this torch cannot run is reported with its error, not allowed to end the run."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - any failure of a baseline is data
        return dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def first_version_splits(batch: int, num_kv_heads: int, max_seq_len: int) -> int:
    """The first version's rule: split only when batch x KV heads leaves SMs idle (4 programs per SM), never
    under two 64-token tiles — one split count for every sequence of the batch, whatever its length."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return max(1, min(4 * sms // (batch * num_kv_heads), max_seq_len // 128, 64))


def bench_decode(heads: str, lengths: list[int], block_size: int, spare: float = 1.0) -> dict:
    """One decode row: our kernel (checked first) and the baselines on the same pool and queries."""
    hq, hkv, d = HEADS[heads]
    batch, ragged = len(lengths), len(set(lengths)) > 1
    x = decode_batch(heads, lengths, block_size, spare)
    k, v, table, q, seq_lens, nbytes = (x[key] for key in ("k", "v", "table", "q", "seq_lens", "bytes"))
    slots, mask = context_slots(table, lengths, block_size), key_mask(lengths)
    tb_s = lambda ms: round(nbytes / ms / 1e9, 3)  # noqa: E731
    ref = decode_reference(q, k, v, table, lengths, block_size)
    splits = num_kv_splits(max(lengths))  # the eager launch: the longest context, a host integer
    ours = lambda: paged_decode_attention(q, k, v, table, seq_lens, splits)  # noqa: E731
    plan = [n for n, _ in split_plan_host(lengths, hkv, splits, DECODE_TILE.get(d, (64, 4))[0],
                                          torch.cuda.get_device_properties(0).multi_processor_count)]
    row = dict(heads=heads, hq=hq, hkv=hkv, d=d, batch=batch, context=max(lengths), ragged=ragged,
               total_tokens=sum(lengths), block_size=block_size, max_splits=splits,
               splits_per_sequence=[min(plan), max(plan)], programs=sum(plan) * hkv, bytes=nbytes,
               triton_rel_err=checked(ours(), ref, f"decode {heads} {batch}x{max(lengths)}"))
    row["triton_tb_s"] = tb_s(median_ms(ours))
    out, partials = torch.empty_like(q), Partials.empty(batch, hq, d, splits, q.device)  # made once, as an engine does
    row["triton_eager_tb_s"] = tb_s(eager_ms(lambda: paged_decode_attention(q, k, v, table, seq_lens, splits, out,
                                                                             partials)))
    if ragged:  # the same kernel on a CUDA graph's grid, and under the first version's rule
        graph_grid = num_kv_splits(GRAPH_CONTEXT)  # one split axis, for any context a graph may replay
        bucket = split_bucket(split_buckets(GRAPH_CONTEXT), max(lengths))  # the axis the runner's buckets replay
        first = first_version_splits(batch, hkv, max(lengths))
        variants = dict(graph_grid=dict(max_splits=graph_grid), bucket=dict(max_splits=bucket),
                        # as many equal splits as the first rule:
                        first_rule=dict(max_splits=first, num_sms=2**26, min_split_len=1))  # split_len 1, capped
        for name, kw in variants.items():
            run = functools.partial(paged_decode_attention, q, k, v, table, seq_lens, **kw)
            checked(run(), ref, f"decode {heads} {name}")
            row[f"triton_{name}_tb_s"] = tb_s(median_ms(run))
        row["graph_grid_splits"], row["bucket_splits"], row["first_rule_splits"] = graph_grid, bucket, first
    else:
        row["first_version_tb_s"] = FIRST_VERSION_TB_S.get((batch, max(lengths), block_size))

    def gather_sdpa():
        kk, vv = gather_kv(k, v, slots)
        return F.scaled_dot_product_attention(q.unsqueeze(2), kk.transpose(1, 2), vv.transpose(1, 2),
                                              attn_mask=mask, enable_gqa=True)
    row["gather_sdpa_tb_s"] = tb_s(median_ms(gather_sdpa))
    if not ragged:
        def course_torch():
            kk, vv = gather_kv(k, v, slots)
            return attention(q.unsqueeze(1), kk, vv, None)
        row["course_torch_tb_s"] = tb_s(median_ms(course_torch))
    contiguous = [t.transpose(1, 2).contiguous() for t in gather_kv(k, v, slots)]  # [B, H_kv, max_len, D]
    row["contiguous_sdpa_tb_s"] = tb_s(median_ms(functools.partial(
        F.scaled_dot_product_attention, q.unsqueeze(2), *contiguous, attn_mask=mask, enable_gqa=True)))
    del contiguous

    def flex() -> dict:
        if block_size < 16:
            return dict(error="FlexAttention needs KV blocks of >= 16 tokens")
        fn = flex_paged_decode(k, v, table, lengths, block_size, hq)
        err = checked(fn(q), ref, f"flex decode {heads}")
        return dict(tb_s=tb_s(median_ms(lambda: fn(q))), rel_err=err)
    row["flex_paged"] = guarded(flex)
    row["copy_tb_s"] = round(copy_bandwidth(nbytes) / 1e12, 3)
    row["triton_tb_s_again"] = tb_s(median_ms(ours))  # the same launch timed twice: the run-to-run spread
    return row


def extend_inputs(prefixes: list[int], news: list[int], block_size: int = 16, heads: str = LLAMA) -> dict:
    hq, hkv, d = HEADS[heads]
    ctx = [p + n for p, n in zip(prefixes, news)]
    k, v, table = paged_pool(ctx, block_size, hkv, d, seed=1)
    q = torch.randn(sum(news), hq, d, dtype=torch.bfloat16, device=DEVICE)
    qsl = torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    seq_lens = torch.tensor(ctx, dtype=torch.int32, device=DEVICE)
    flops = 4 * d * hq * sum(n * p + n * (n + 1) // 2 for p, n in zip(prefixes, news))  # visible pairs only
    return dict(k=k, v=v, table=table, q=q, qsl=qsl, seq_lens=seq_lens, ctx=ctx, news=news, flops=flops, hq=hq,
                hkv=hkv, d=d)


def bench_prefill(prefixes: list[int], news: list[int], block_size: int = 16, **launch) -> dict:
    """Prefill with a cached prefix: ours against FlexAttention over contiguous (padded) K/V with the
    bottom-right causal mask, and SDPA where every sequence has the same shape."""
    x = extend_inputs(prefixes, news, block_size)
    k, v, table, q, ctx, hq, hkv, d = x["k"], x["v"], x["table"], x["q"], x["ctx"], x["hq"], x["hkv"], x["d"]
    tflop_s = lambda ms: round(x["flops"] / ms / 1e9, 1)  # noqa: E731
    uniform = len(set(prefixes)) == 1 and len(set(news)) == 1
    B, max_new, max_ctx = len(news), max(news), max(ctx)

    ours = lambda: extend_attention(q, k, v, table, x["qsl"], x["seq_lens"], max_new, **launch)  # noqa: E731
    row = dict(batch=B, prefixes=prefixes, news=news, prefix=max(prefixes), new=max_new, block_size=block_size,
               flops=x["flops"])
    out = ours()
    row["triton_rel_err"] = check_prefill(out, x, k, v, "extend", block_size)
    ck, cv = [t.transpose(1, 2).contiguous() for t in gather_kv(k, v, context_slots(table, ctx, block_size))]
    row["triton_tflop_s"] = tflop_s(median_ms(ours))

    qc = torch.zeros(B, hq, max_new, d, dtype=q.dtype, device=DEVICE)  # queries padded to the longest chunk
    for i in range(B):
        qc[i, :, : news[i]] = q[int(x["qsl"][i]): int(x["qsl"][i]) + news[i]].transpose(0, 1)

    def sdpa() -> dict:
        if not uniform:
            return dict(error="SDPA takes one mask shape for the batch: not run on the ragged batch")
        from torch.nn.attention.bias import causal_lower_right
        kr, vr = ck.repeat_interleave(hq // hkv, 1), cv.repeat_interleave(hq // hkv, 1)
        bias = causal_lower_right(max_new, max_ctx)
        return dict(tflop_s=tflop_s(median_ms(lambda: F.scaled_dot_product_attention(qc, kr, vr, attn_mask=bias))))
    row["sdpa"] = guarded(sdpa)

    def flex() -> dict:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        pre = torch.tensor(prefixes, device=DEVICE)
        new = torch.tensor(news, device=DEVICE)

        def causal(b, h, qi, ki):  # bottom-right: query qi of sequence b sits at position prefix + qi
            return (qi < new[b]) & (ki <= qi + pre[b])
        if uniform:
            mask = create_block_mask(lambda b, h, qi, ki: ki <= qi + prefixes[0], None, None, max_new, max_ctx,
                                     device=DEVICE)
        else:
            mask = create_block_mask(causal, B, None, max_new, max_ctx, device=DEVICE)
        fn = torch.compile(flex_attention, dynamic=False)
        got = fn(qc, ck, cv, block_mask=mask, enable_gqa=True)
        err = max(rel_err(got[i, :, : news[i]].transpose(0, 1), out[int(x["qsl"][i]): int(x["qsl"][i]) + news[i]])
                  for i in range(B))  # against ours, which matched the fp32 reference
        return dict(tflop_s=tflop_s(median_ms(lambda: fn(qc, ck, cv, block_mask=mask, enable_gqa=True))),
                    rel_err_vs_triton=err)
    row["flex"] = guarded(flex)
    return row


def ragged_prefill_shape() -> tuple[list[int], list[int]]:
    r = RAGGED_PREFILL
    g = torch.Generator().manual_seed(r["seed"])
    prefixes = torch.randint(0, r["max_prefix"] + 1, (r["batch"],), generator=g).tolist()
    news = torch.randint(r["new"][0], r["new"][1] + 1, (r["batch"],), generator=g).tolist()
    return prefixes, news


def bench_store(tokens: int = 65536, block_size: int = 16) -> dict:
    _, hkv, d = HEADS[LLAMA]
    dtype = torch.bfloat16
    num_blocks = 2 * tokens // block_size
    kc = torch.randn(num_blocks, block_size, hkv, d, dtype=dtype, device=DEVICE)
    vc = torch.randn_like(kc)
    k = torch.randn(tokens, hkv, d, dtype=dtype, device=DEVICE)
    v = torch.randn_like(k)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:tokens]
    store_kvcache(k, v, kc, vc, slots)
    ok = torch.equal(kc.view(-1, hkv, d)[slots], k) and torch.equal(vc.view(-1, hkv, d)[slots], v)
    ms = median_ms(lambda: store_kvcache(k, v, kc, vc, slots))
    nbytes = 2 * (k.nbytes + v.nbytes) + slots.nbytes  # read and write each row once, read the slots

    def index_put():
        kc.view(-1, hkv, d)[slots] = k
        vc.view(-1, hkv, d)[slots] = v
    return dict(tokens=tokens, block_size=block_size, correct=ok, triton_gb_s=round(nbytes / ms / 1e6, 1),
                torch_index_put_gb_s=round(nbytes / median_ms(index_put) / 1e6, 1))


def goals(res: dict) -> list[dict]:
    """The chapter's targets, each with the measured number and met / missed."""
    dec = {(r["heads"], r["ragged"], r["batch"], r["context"], r["block_size"]): r for r in res["decode"]}
    b0, c0 = UNIFORM_SHAPES[0]
    main, b1 = dec[(LLAMA, False, b0, c0, 16)], dec[(LLAMA, False, b0, c0, 1)]
    ragged = {(r["heads"], r["block_size"]): r for r in res["decode"] if r["ragged"]}
    flex = main["flex_paged"].get("tb_s")
    uniform = [(r["triton_tb_s"] / FIRST_VERSION_TB_S[(r["batch"], r["context"], r["block_size"])], r)
               for r in res["decode"] if not r["ragged"]]
    worst, worst_row = min(uniform, key=lambda t: t[0])
    spread = max(abs(r["triton_tb_s"] - r["triton_tb_s_again"]) / r["triton_tb_s"] for r in res["decode"])
    blocks = min(ragged[(h, 1)]["triton_tb_s"] / ragged[(h, 16)]["triton_tb_s"] for h in HEADS)
    pre, pre_flex = res["prefill"]["triton_tflop_s"], res["prefill"]["flex"].get("tflop_s")
    return [
        dict(goal=f"decode ragged {LLAMA} block 16 >= 3.8 TB/s", measured=ragged[(LLAMA, 16)]["triton_tb_s"],
             met=ragged[(LLAMA, 16)]["triton_tb_s"] >= 3.8),
        dict(goal=f"decode ragged {SMOLLM2} block 16 >= 3.2 TB/s", measured=ragged[(SMOLLM2, 16)]["triton_tb_s"],
             met=ragged[(SMOLLM2, 16)]["triton_tb_s"] >= 3.2),
        dict(goal="decode ragged block 1 / block 16 >= 0.9 (worse head shape)", measured=round(blocks, 3),
             met=blocks >= 0.9),
        dict(goal=f"decode uniform rows / first version >= 1 - run-to-run spread ({spread:.1%}), worst row "
                  f"{worst_row['batch']}x{worst_row['context']} block {worst_row['block_size']}",
             measured=round(worst, 3), met=worst >= 1 - spread),
        dict(goal=f"decode {b0}x{c0} block 16 >= 4.0 TB/s", measured=main["triton_tb_s"],
             met=main["triton_tb_s"] >= 4.0),
        dict(goal="decode >= 3x gather+SDPA", measured=round(main["triton_tb_s"] / main["gather_sdpa_tb_s"], 2),
             met=main["triton_tb_s"] >= 3 * main["gather_sdpa_tb_s"]),
        dict(goal="decode >= 1.8x FlexAttention paged", measured=round(main["triton_tb_s"] / flex, 2) if flex
             else None, met=bool(flex) and main["triton_tb_s"] >= 1.8 * flex),
        dict(goal=f"decode {b0}x{c0} block 1 >= 3.0 TB/s", measured=b1["triton_tb_s"], met=b1["triton_tb_s"] >= 3.0),
        dict(goal="prefill with prefix >= FlexAttention, TFLOP/s", measured=pre, flex=pre_flex,
             met=bool(pre_flex) and pre >= pre_flex),
    ]


def sweep() -> dict:
    """The launch configurations the kernels' defaults come from: decode tiles (BLOCK_N, warps) and the ragged
    rule's programs per SM, on the ragged batch and the uniform 64 x 4096, both head shapes; prefill tiles on
    the uniform and the ragged prefill."""
    from step06_triton import decode_attention as da
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rag = ragged_lengths(RAGGED["batch"], 1, RAGGED["max_context"], RAGGED["seed"])
    b0, c0 = UNIFORM_SHAPES[0]
    out: dict = dict(decode=[], prefill=[])
    for heads in HEADS:
        for name, lengths, spare in (("ragged", rag, 2.0), (f"{b0}x{c0}", [c0] * b0, 1.0)):
            hq, hkv, d = HEADS[heads]
            k, v, table = paged_pool(lengths, 16, hkv, d, spare)
            q = torch.randn(len(lengths), hq, d, dtype=torch.bfloat16, device=DEVICE)
            seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
            nbytes = 2 * sum(lengths) * hkv * d * 2 + 2 * q.nbytes
            runs = [dict(per_sm=da.PROGRAMS_PER_SM, block_n=n, warps=w) for n, w in ((64, 4), (128, 4), (128, 8),
                                                                                      (32, 4), (64, 8))]
            if name == "ragged":
                runs += [dict(per_sm=p, block_n=None, warps=None) for p in (4, 8, 32)]
            for r in runs:
                run = functools.partial(paged_decode_attention, q, k, v, table, seq_lens, num_kv_splits(max(lengths)),
                                        num_sms=sms * r["per_sm"] // da.PROGRAMS_PER_SM, block_n=r["block_n"],
                                        num_warps=r["warps"])
                row = dict(heads=heads, batch=name, block_size=16, **r)
                try:
                    row["tb_s"] = round(nbytes / median_ms(run) / 1e9, 3)
                except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory for this tile
                    row["error"] = str(exc)[:120]
                out["decode"].append(row)
                print("sweep", json.dumps(row), flush=True)
            del k, v
            torch.cuda.empty_cache()
    for prefixes, news in ([[PREFILL_SHAPE[1]] * PREFILL_SHAPE[0], [PREFILL_SHAPE[2]] * PREFILL_SHAPE[0]],
                           ragged_prefill_shape()):
        x = extend_inputs(prefixes, news)
        for bm, bn, warps, stages in ((128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 2), (128, 64, 4, 3),
                                      (64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 4, 2)):
            row = dict(batch=len(news), prefix=max(prefixes), new=max(news), block_m=bm, block_n=bn, warps=warps,
                       stages=stages)
            try:
                ms = median_ms(functools.partial(extend_attention, x["q"], x["k"], x["v"], x["table"], x["qsl"],
                                                 x["seq_lens"], max(news), block_m=bm, block_n=bn, num_warps=warps,
                                                 num_stages=stages))
                row["tflop_s"] = round(x["flops"] / ms / 1e9, 1)
            except Exception as exc:  # noqa: BLE001
                row["error"] = str(exc)[:120]
            out["prefill"].append(row)
            print("sweep", json.dumps(row), flush=True)
    return out


def run_kernels() -> dict:
    res: dict = dict(timing="median of CUDA-graph replays, L2 flushed before each (triton.testing.do_bench)",
                     ceilings=ceilings(), ragged=RAGGED, ragged_prefill_shape=RAGGED_PREFILL, decode=[], prefill=None,
                     ragged_prefill=None, store=None)
    for heads, lengths, spare, block_size in decode_table_rows():
        res["decode"].append(bench_decode(heads, lengths, block_size, spare))
        print("decode", json.dumps(res["decode"][-1]), flush=True)
        torch.cuda.empty_cache()
    batch, prefix, new = PREFILL_SHAPE
    res["prefill"] = bench_prefill([prefix] * batch, [new] * batch)
    print("prefill", json.dumps(res["prefill"]), flush=True)
    res["ragged_prefill"] = bench_prefill(*ragged_prefill_shape())
    print("ragged prefill", json.dumps(res["ragged_prefill"]), flush=True)
    res["store"] = bench_store()
    print("store", json.dumps(res["store"]), flush=True)
    res["goals"] = goals(res)
    for g in res["goals"]:
        print(f"{'met   ' if g['met'] else 'MISSED'} {g['measured']}  {g['goal']}", flush=True)
    return res


def short_sweep() -> dict:
    """Decode over short ragged contexts (SHORT): one wave of a few hundred programs on 132 SMs, each walking up
    to MIN_SPLIT_LEN keys alone, is latency-bound; a lower floor on the split length gives more, shorter programs
    and a merge. Each floor and tile, checked, then timed (the merge included), both head shapes."""
    lengths = ragged_lengths(SHORT["batch"], SHORT["low"], SHORT["high"], SHORT["seed"])
    out: dict = dict(lengths=dict(batch=len(lengths), total=sum(lengths), max=max(lengths)), rows=[])
    for heads in HEADS:
        x = decode_batch(heads, lengths)
        k, v, table, q, seq_lens, nbytes = (x[key] for key in ("k", "v", "table", "q", "seq_lens", "bytes"))
        ref = decode_reference(q, k, v, table, lengths)
        for floor in (32, 64, 128, 256, 512):
            for block_n, warps in ((32, 4), (64, 4)):
                run = functools.partial(paged_decode_attention, q, k, v, table, seq_lens,
                                        num_kv_splits(max(lengths), floor), min_split_len=floor, block_n=block_n,
                                        num_warps=warps)
                row = dict(heads=heads, min_split_len=floor, block_n=block_n, warps=warps,
                           rel_err=checked(run(), ref, f"short decode {heads} floor {floor}"))
                us = median_ms(run) * 1e3
                row.update(us=round(us, 2), tb_s=round(nbytes / us / 1e6, 3))
                out["rows"].append(row)
                print("short", json.dumps(row), flush=True)
        del k, v
        torch.cuda.empty_cache()
    return out


def run_once_for_ncu() -> None:
    """For Nsight Compute (`ncu --kernel-name regex:'decode|merge|extend|flex'`): the ragged decode of each head
    shape once, then the prefill shape once through our kernel and once through FlexAttention, each after a
    warm-up call."""
    for heads in HEADS:
        x = ragged_decode_batch(heads)
        paged_decode_attention(x["q"], x["k"], x["v"], x["table"], x["seq_lens"], num_kv_splits(max(x["lengths"])))
    batch, prefix, new = PREFILL_SHAPE
    x = extend_inputs([prefix] * batch, [new] * batch)
    extend_attention(x["q"], x["k"], x["v"], x["table"], x["qsl"], x["seq_lens"], new)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    ck, cv = [t.transpose(1, 2).contiguous() for t in gather_kv(x["k"], x["v"], context_slots(
        x["table"], x["ctx"], 16))]
    qc = x["q"].view(batch, new, x["hq"], x["d"]).transpose(1, 2).contiguous()
    mask = create_block_mask(lambda b, h, qi, ki: ki <= qi + prefix, None, None, new, prefix + new, device=DEVICE)
    flex = torch.compile(flex_attention, dynamic=False)
    flex(qc, ck, cv, block_mask=mask, enable_gqa=True)
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["kernels", "sweep", "short", "all", "ncu"], default="all")
    ap.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    ap.add_argument("--out", type=Path, help="also write the JSON to this file (e.g. results/h200.json)")
    args = ap.parse_args(argv)
    if not needs_gpu("benchmarks.step06.kernels"):
        return 2
    torch._dynamo.config.cache_size_limit = 64  # FlexAttention compiles once per shape; the bench has a dozen
    if args.part == "ncu":
        run_once_for_ncu()
        return 0
    command = " ".join(["python -m benchmarks.step06.kernels", *(sys.argv[1:] if argv is None else argv)])
    keep = json.loads(args.out.read_text()) if args.out and args.out.is_file() and args.part != "all" else {}
    result: dict = dict(chapter="step06", machine=keep.get("machine") or machine(),
                        **{k: v for k, v in keep.items() if k not in ("chapter", "machine")})
    if args.part == "sweep":
        result["sweep"] = dict(command=command, machine=machine(), **sweep())
    if args.part == "short":
        result["short"] = dict(command=command, machine=machine(), **short_sweep())
    if args.part in ("kernels", "all"):
        result["kernels"] = dict(command=command, machine=machine(), **run_kernels())
    text = json.dumps(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
