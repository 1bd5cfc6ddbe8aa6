"""`python -m step06_triton.bench [--json] [--out FILE] [--part kernels|engine|all]`: the chapter's kernels and
engine on a GPU, against what a user would pick instead, side by side in one run.

Kernels (bf16, 32 query / 8 KV heads, head_dim 128: one Llama-3-8B layer):
* decode at (batch, context) = (64, 4096), (256, 1024), (8, 32768), blocks of 16 and of 1 — achieved TB/s
  (K/V and q read, output written, over kernel time) for our split-KV kernel, gather-then-SDPA, the course's
  torch path (chapter 2: gather, then chapter 1's `attention`), FlexAttention over a paged block mask, and
  contiguous SDPA (no paging: the ceiling a paged kernel chases); the device copy bandwidth is the limit;
* prefill with a cached prefix at (B 4, prefix 4096, new 2048): TFLOP/s against SDPA (contiguous, causal
  aligned bottom-right) and FlexAttention;
* store_kvcache: GB/s.
Engine (see `e2e.py`): chapter 5's engine on the SmolLM2-135M architecture with random weights.

Every timing is the median of `triton.testing.do_bench` (CUDA events, warm-up first); every kernel is
checked against a torch reference on fresh random data before it is timed. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from step01_kvcache.attention import attention

from .decode_attention import default_num_splits, paged_decode_attention
from .extend_attention import extend_attention
from .store_kvcache import store_kvcache

HQ, HKV, D = 32, 8, 128
DECODE_SHAPES = [(64, 4096), (256, 1024), (8, 32768)]
PREFILL_SHAPE = (4, 4096, 2048)  # batch, cached prefix, new tokens
RESULTS = Path(__file__).parent / "results"


def median_ms(fn: Callable[[], object]) -> float:
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median"))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def machine() -> dict:
    import triton
    props = torch.cuda.get_device_properties(0)
    return dict(gpu=props.name, sms=props.multi_processor_count, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
                date=datetime.date.today().isoformat())


def ceilings() -> dict:
    """What the card can do at all: device-to-device copy (bytes read + written) and a bf16 matmul."""
    x = torch.randn(2**30 // 2, dtype=torch.bfloat16, device="cuda")  # 1 GiB
    ms = median_ms(lambda: x.clone())
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm = median_ms(lambda: a @ b)
    return dict(copy_tb_s=round(2 * x.nbytes / ms / 1e9, 3), matmul_tflop_s=round(2 * 8192**3 / mm / 1e9, 1))


# ---- a paged pool with random block tables ----------------------------------------------------------------
def paged_pool(batch: int, context: int, block_size: int, dtype: torch.dtype, heads: int = HKV, dim: int = D,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K/V pools [num_blocks, block_size, heads, dim] filled with random data and, for every sequence, a block
    table of randomly scattered physical blocks (int32, as vLLM keeps them)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    per_seq = math.ceil(context / block_size)
    num_blocks = batch * per_seq
    k = torch.randn(num_blocks, block_size, heads, dim, dtype=dtype, device="cuda", generator=g)
    v = torch.randn(num_blocks, block_size, heads, dim, dtype=dtype, device="cuda", generator=g)
    table = torch.randperm(num_blocks, device="cuda", generator=g).view(batch, per_seq).to(torch.int32)
    return k, v, table


def context_slots(table: torch.Tensor, context: int, block_size: int) -> torch.Tensor:
    pos = torch.arange(context, device=table.device)
    return table.long()[:, pos // block_size] * block_size + pos % block_size  # [B, context]


def gather_kv(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, context, H_kv, D] copies of every sequence's K/V: what a kernel without paging needs first."""
    flat_k, flat_v = k.view(-1, k.shape[-2], k.shape[-1]), v.view(-1, v.shape[-2], v.shape[-1])
    return flat_k[slots], flat_v[slots]


def flex_paged_decode(k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, block_size: int):
    """FlexAttention reading the pool in place: the pool is one long KV sequence [1, H_kv, num_slots, D] and the
    block mask lists, for each sequence, its physical blocks (all full here, so the compiled kernel never runs
    the mask_mod; eager mode evaluates it element by element: "this slot's block belongs to sequence b")."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    B, pages = table.shape
    num_blocks = k.shape[0]
    num_slots = num_blocks * block_size
    kp = k.view(1, num_slots, HKV, D).transpose(1, 2)
    vp = v.view(1, num_slots, HKV, D).transpose(1, 2)
    owner = torch.empty(num_blocks, dtype=torch.long, device=k.device)
    owner[table.long().flatten()] = torch.arange(B, device=k.device).repeat_interleave(pages)
    indices = torch.zeros(B, 1, 1, num_blocks, dtype=torch.int32, device=k.device)
    indices[..., :pages] = table.view(B, 1, 1, pages)
    mask = BlockMask.from_kv_blocks(torch.zeros(B, 1, 1, dtype=torch.int32, device=k.device), torch.zeros_like(indices),
                                    torch.full((B, 1, 1), pages, dtype=torch.int32, device=k.device), indices,
                                    BLOCK_SIZE=(128, block_size), seq_lengths=(1, num_slots),
                                    mask_mod=lambda b, h, q_idx, kv_idx: owner[kv_idx // block_size] == b)
    flex = torch.compile(flex_attention, dynamic=False)
    return lambda q: flex(q.view(B, HQ, 1, D), kp, vp, block_mask=mask, enable_gqa=True)


def guarded(fn: Callable[[], dict]) -> dict:
    """A baseline that this torch cannot run is reported with its error, not allowed to end the run."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - any failure of a baseline is data
        return dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def bench_decode(batch: int, context: int, block_size: int) -> dict:
    dtype = torch.bfloat16
    k, v, table = paged_pool(batch, context, block_size, dtype)
    q = torch.randn(batch, HQ, D, dtype=dtype, device="cuda")
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    splits = default_num_splits(batch, HKV, context, target_programs=4 * torch.cuda.get_device_properties(0)
                                .multi_processor_count)
    slots = context_slots(table, context, block_size)
    nbytes = 2 * batch * context * HKV * D * k.element_size() + 2 * q.nbytes  # K, V read; q read, out written
    tb_s = lambda ms: round(nbytes / ms / 1e9, 3)  # noqa: E731

    # reference: gather, then SDPA in fp32
    gk, gv = gather_kv(k, v, slots)
    ref = F.scaled_dot_product_attention(q.float().unsqueeze(2), gk.float().transpose(1, 2),
                                         gv.float().transpose(1, 2), enable_gqa=True).squeeze(2)
    ours = lambda: paged_decode_attention(q, k, v, table, seq_lens, splits)  # noqa: E731
    row = dict(batch=batch, context=context, block_size=block_size, num_splits=splits, bytes=nbytes,
               triton_rel_err=rel_err(ours(), ref))
    row["triton_tb_s"] = tb_s(median_ms(ours))

    def gather_sdpa():
        kk, vv = gather_kv(k, v, slots)
        return F.scaled_dot_product_attention(q.unsqueeze(2), kk.transpose(1, 2), vv.transpose(1, 2),
                                              enable_gqa=True)
    row["gather_sdpa_tb_s"] = tb_s(median_ms(gather_sdpa))

    def course_torch():
        kk, vv = gather_kv(k, v, slots)
        return attention(q.unsqueeze(1), kk, vv, None)
    row["course_torch_tb_s"] = tb_s(median_ms(course_torch))
    del gk, gv
    contiguous = [t.transpose(1, 2).contiguous() for t in gather_kv(k, v, slots)]  # [B, H_kv, context, D]
    row["contiguous_sdpa_tb_s"] = tb_s(median_ms(functools.partial(
        F.scaled_dot_product_attention, q.unsqueeze(2), *contiguous, enable_gqa=True)))
    del contiguous

    def flex() -> dict:
        if block_size < 16:
            return dict(error="FlexAttention needs KV blocks of >= 16 tokens")
        fn = flex_paged_decode(k, v, table, block_size)
        err = rel_err(fn(q).view(batch, HQ, D), ref)
        return dict(tb_s=tb_s(median_ms(lambda: fn(q))), rel_err=err)
    row["flex_paged"] = guarded(flex)
    return row


def bench_prefill(batch: int, prefix: int, new: int, block_size: int = 16) -> dict:
    dtype = torch.bfloat16
    ctx = prefix + new
    k, v, table = paged_pool(batch, ctx, block_size, dtype, seed=1)
    q = torch.randn(batch * new, HQ, D, dtype=dtype, device="cuda")
    qsl = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device="cuda")
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    flops = 4 * D * HQ * batch * (new * prefix + new * (new + 1) // 2)  # QK^T and PV over visible pairs only
    tflop_s = lambda ms: round(flops / ms / 1e9, 1)  # noqa: E731

    ck, cv = [t.transpose(1, 2).contiguous() for t in gather_kv(k, v, context_slots(table, ctx, block_size))]
    qc = q.view(batch, new, HQ, D).transpose(1, 2).contiguous()
    visible = torch.arange(ctx, device="cuda")[None, :] <= (prefix + torch.arange(new, device="cuda"))[:, None]
    ref = F.scaled_dot_product_attention(qc[:1].float(), ck[:1].float().repeat_interleave(HQ // HKV, 1),
                                         cv[:1].float().repeat_interleave(HQ // HKV, 1), attn_mask=visible)
    ours = lambda: extend_attention(q, k, v, table, qsl, seq_lens, new)  # noqa: E731
    row = dict(batch=batch, prefix=prefix, new=new, block_size=block_size, flops=flops,
               triton_rel_err=rel_err(ours()[:new].view(new, HQ, D).transpose(0, 1), ref[0]))
    row["triton_tflop_s"] = tflop_s(median_ms(ours))

    def sdpa() -> dict:
        from torch.nn.attention.bias import causal_lower_right
        kr, vr = ck.repeat_interleave(HQ // HKV, 1), cv.repeat_interleave(HQ // HKV, 1)
        bias = causal_lower_right(new, ctx)
        return dict(tflop_s=tflop_s(median_ms(lambda: F.scaled_dot_product_attention(qc, kr, vr, attn_mask=bias))))
    row["sdpa"] = guarded(sdpa)

    def flex() -> dict:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        mask = create_block_mask(lambda b, h, qi, ki: ki <= qi + prefix, None, None, new, ctx, device="cuda")
        fn = torch.compile(flex_attention, dynamic=False)
        return dict(tflop_s=tflop_s(median_ms(lambda: fn(qc, ck, cv, block_mask=mask, enable_gqa=True))))
    row["flex"] = guarded(flex)
    return row


def bench_store(tokens: int = 65536, block_size: int = 16) -> dict:
    dtype = torch.bfloat16
    num_blocks = 2 * tokens // block_size
    kc = torch.randn(num_blocks, block_size, HKV, D, dtype=dtype, device="cuda")
    vc = torch.randn_like(kc)
    k = torch.randn(tokens, HKV, D, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    slots = torch.randperm(num_blocks * block_size, device="cuda")[:tokens]
    store_kvcache(k, v, kc, vc, slots)
    ok = torch.equal(kc.view(-1, HKV, D)[slots], k) and torch.equal(vc.view(-1, HKV, D)[slots], v)
    ms = median_ms(lambda: store_kvcache(k, v, kc, vc, slots))
    nbytes = 2 * (k.nbytes + v.nbytes) + slots.nbytes  # read and write each row once, read the slots

    def index_put():
        kc.view(-1, HKV, D)[slots] = k
        vc.view(-1, HKV, D)[slots] = v
    return dict(tokens=tokens, block_size=block_size, correct=ok, triton_gb_s=round(nbytes / ms / 1e6, 1),
                torch_index_put_gb_s=round(nbytes / median_ms(index_put) / 1e6, 1))


def goals(res: dict) -> list[dict]:
    """The chapter's targets, each with the measured number and met / missed."""
    dec = {(r["batch"], r["context"], r["block_size"]): r for r in res["decode"]}
    main, b1 = dec[(64, 4096, 16)], dec[(64, 4096, 1)]
    flex = main["flex_paged"].get("tb_s")
    out = [dict(goal="decode 64x4096 block 16 >= 4.0 TB/s", measured=main["triton_tb_s"],
                met=main["triton_tb_s"] >= 4.0),
           dict(goal="decode >= 3x gather+SDPA", measured=round(main["triton_tb_s"] / main["gather_sdpa_tb_s"], 2),
                met=main["triton_tb_s"] >= 3 * main["gather_sdpa_tb_s"]),
           dict(goal="decode >= 1.8x FlexAttention paged", measured=round(main["triton_tb_s"] / flex, 2) if flex
                else None, met=bool(flex) and main["triton_tb_s"] >= 1.8 * flex),
           dict(goal="decode 64x4096 block 1 >= 3.0 TB/s", measured=b1["triton_tb_s"], met=b1["triton_tb_s"] >= 3.0),
           dict(goal="prefill with prefix >= 350 TFLOP/s", measured=res["prefill"]["triton_tflop_s"],
                met=res["prefill"]["triton_tflop_s"] >= 350)]
    return out


def sweep() -> dict:
    """Launch configurations tried on the goal shapes; the defaults in the kernels' wrappers come from here."""
    out: dict = dict(decode=[], prefill=[])
    for block_size in (16, 1):
        k, v, table = paged_pool(64, 4096, block_size, torch.bfloat16)
        q = torch.randn(64, HQ, D, dtype=torch.bfloat16, device="cuda")
        seq_lens = torch.full((64,), 4096, dtype=torch.int32, device="cuda")
        nbytes = 2 * k.nbytes + 2 * q.nbytes
        for splits in (1, 2, 4):
            for block_n in (32, 64, 128):
                for warps, stages in ((4, 2), (4, 3), (8, 3)):
                    run = functools.partial(paged_decode_attention, q, k, v, table, seq_lens, splits,
                                            block_n=block_n, num_warps=warps, num_stages=stages)
                    ms = median_ms(run)
                    out["decode"].append(dict(block_size=block_size, splits=splits, block_n=block_n, warps=warps,
                                              stages=stages, tb_s=round(nbytes / ms / 1e9, 3)))
        del k, v
    batch, prefix, new = PREFILL_SHAPE
    k, v, table = paged_pool(batch, prefix + new, 16, torch.bfloat16, seed=1)
    q = torch.randn(batch * new, HQ, D, dtype=torch.bfloat16, device="cuda")
    qsl = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device="cuda")
    seq_lens = torch.full((batch,), prefix + new, dtype=torch.int32, device="cuda")
    flops = 4 * D * HQ * batch * (new * prefix + new * (new + 1) // 2)
    for bm, bn, warps, stages in ((64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3),
                                  (128, 32, 4, 4), (64, 128, 4, 3), (128, 64, 8, 4)):
        try:
            ms = median_ms(functools.partial(extend_attention, q, k, v, table, qsl, seq_lens, new, block_m=bm,
                                             block_n=bn, num_warps=warps, num_stages=stages))
            out["prefill"].append(dict(block_m=bm, block_n=bn, warps=warps, stages=stages,
                                       tflop_s=round(flops / ms / 1e9, 1)))
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory for this tile
            out["prefill"].append(dict(block_m=bm, block_n=bn, warps=warps, stages=stages, error=str(exc)[:120]))
    return out


def run_kernels(with_sweep: bool = False) -> dict:
    res: dict = dict(ceilings=ceilings(), decode=[], prefill=None, store=None)
    if with_sweep:
        res["sweep"] = sweep()
        for row in res["sweep"]["decode"] + res["sweep"]["prefill"]:
            print("sweep", json.dumps(row), flush=True)
    for batch, context in DECODE_SHAPES:
        for block_size in (16, 1):
            res["decode"].append(bench_decode(batch, context, block_size))
            print("decode", json.dumps(res["decode"][-1]), flush=True)
            torch.cuda.empty_cache()
    res["prefill"] = bench_prefill(*PREFILL_SHAPE)
    print("prefill", json.dumps(res["prefill"]), flush=True)
    res["store"] = bench_store()
    print("store", json.dumps(res["store"]), flush=True)
    res["goals"] = goals(res)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["kernels", "engine", "all"], default="all")
    ap.add_argument("--sweep", action="store_true", help="also time the launch configurations the defaults come from")
    ap.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    ap.add_argument("--out", type=Path, help="also write the JSON to this file (e.g. results/h200.json)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("step06_triton.bench needs a CUDA GPU (the CPU runs the kernels only through Triton's interpreter, "
              "which measures nothing); run it on a GPU machine", file=sys.stderr)
        return 2
    result: dict = dict(chapter="step06", machine=machine())
    if args.part in ("kernels", "all"):
        result["kernels"] = run_kernels(args.sweep)
    if args.part in ("engine", "all"):
        from .e2e import run_engine_bench
        result["engine"] = run_engine_bench()
    text = json.dumps(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
