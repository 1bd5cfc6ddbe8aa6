"""Kernel 2 of 3: paged decode attention — one new token per sequence, K/V read through the block table.

Decode is memory-bound: each step reads every cached K/V byte once and does ~2 FLOPs per byte with it, far
below the ~200 FLOP/byte at which an H200 becomes compute-bound. So the kernel is judged by bytes per second,
and three ideas keep the memory system busy:

* **GQA grouping.** One program serves the g query heads that share a KV head: K/V is read once for the
  group, not g times. The g query rows are padded to 16 so they form a matrix for `tl.dot`.
* **Split-KV (flash-decoding), cut by work.** A launch lasts as long as its slowest program. A batch whose
  contexts are about equal (within 20%) is already a set of equal programs: it is split only when B x H_kv
  programs cannot fill the GPU (4 per SM), as flash-decoding does. A ragged batch is cut into splits of about
  the same length for every sequence, `split_len = max(min_split_len, total_tokens * H_kv / (16 * SMs))`: a
  short context stays one split, a long one becomes several, and no program walks a long context alone while
  the others have finished. Each program evaluates this plan itself (`split_plan`) from `seq_lens` on the
  device, so the host never reads a length: a CUDA graph replays one fixed grid (H_kv, B, max_splits) with new
  lengths every step, and programs past the end of their sequence return at once. A sequence of one split
  writes its output directly; the others write partial outputs with their log-sum-exp, merged by a second
  tiny kernel (stage 1 / stage 2, as in SGLang's `decode_attention.py`, whose `num_kv_splits` is also chosen
  per request on the device).
* **Online softmax.** Each program walks its split in tiles of BLOCK_N tokens keeping a running max `m`, a
  running denominator `l_i` and an unnormalised accumulator, rescaled when the max grows — one pass over K/V.

Addresses: token `pos` of sequence `b` lives in physical block `block_table[b, pos // BLOCK_SIZE]` at offset
`pos % BLOCK_SIZE`; the pool row is `block * BLOCK_SIZE + offset` (int64 before multiplying by the row
stride). A tile of BLOCK_N tokens may span several blocks (BLOCK_SIZE = 1 is SGLang's token-level pool).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from step02_paged.geometry import cdiv

from . import fp8_pool
from .launch import H200_SMS, check_attention_inputs, sm_count
from .store_kvcache import kernel_scales

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2 e): exp2 is the fast hardware instruction
PROGRAMS_PER_SM = 16  # ragged batches: splits of equal work, this many per SM, so the last ends soon after the rest
FILL_PER_SM = 4  # near-uniform batches: split only until there are this many programs per SM
NEAR_UNIFORM = tl.constexpr(4)  # near-uniform: the shortest context is at least NEAR_UNIFORM / 5 of the longest
MIN_SPLIT_LEN = 512  # tokens: shorter splits cost more in partial outputs and merging than they win
MAX_SPLITS = 64  # the merge holds every split of a head in registers
# head_dim -> (BLOCK_N, num_warps), from `python -m benchmarks.step06.kernels --part sweep`
DECODE_TILE = {64: (64, 4), 128: (64, 4)}
# Over an FP8 pool the weights p_j s_j reach fp16 times this power of two (`attend_tile`, `values`): large enough
# that a row whose largest value is 0.001 keeps fp16's full precision for every weight p_j above 0.03, small enough
# that only values above 28,000 would overflow fp16.
VALUE_SCALE = tl.constexpr(1024.0)
# an FP8 pool: twice the keys per tile, the best of `python -m benchmarks.step06.fp8`
DECODE_TILE_FP8 = {64: (128, 4), 128: (128, 4)}


@triton.jit
def dot(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b in fp32; fp32 inputs in exact IEEE arithmetic (no TF32), so tests can compare tokens."""
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def tile_addresses(block_table_ptr, b, stride_bt_b, kv_head, pos, in_seq, H_KV: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr):
    """Step 1 of `attend_tile`: where the keys at positions pos [BLOCK_N] of sequence b live. Returns each key's
    `slot` [BLOCK_N] (its row of the pool, block * BLOCK_SIZE + offset, in int64) and the offsets [BLOCK_N, HEAD_DIM]
    of its head `kv_head`'s elements in one layer of the pool [num_slots, H_KV, HEAD_DIM]. Keys with in_seq False
    lie past the sequence: their block-table entries may not exist and are not read, and their slot is still a row
    of the pool (an FP8 pool's scales are read for every key of the tile)."""
    dims = tl.arange(0, HEAD_DIM)
    # BEGIN SOLUTION task6.address points=2
    block = tl.load(block_table_ptr + b * stride_bt_b + pos // BLOCK_SIZE, mask=in_seq, other=0).to(tl.int64)
    slot = block * BLOCK_SIZE + pos % BLOCK_SIZE
    kv_offs = slot[:, None] * (H_KV * HEAD_DIM) + kv_head * HEAD_DIM + dims[None, :]
    # END SOLUTION
    return slot, kv_offs


@triton.jit
def causal_scores(s, pos, q_pos):
    """Step 2 of `attend_tile` for prefill: the scores s [M, BLOCK_N] of query rows at positions q_pos [M] against
    keys at positions pos [BLOCK_N], with -inf where a key comes after the row's own position (a row sees itself
    and every key before it)."""
    # BEGIN SOLUTION task6.causal points=2
    s = tl.where(pos[None, :] <= q_pos[:, None], s, float("-inf"))
    # END SOLUTION
    return s


@triton.jit
def online_softmax(m_i, l_i, acc, s, v, v_weight, sm_scale_log2, IEEE: tl.constexpr):
    """Step 3 of `attend_tile`: one tile's raw scores s [M, BLOCK_N] (-inf for hidden keys) and values v [BLOCK_N,
    HEAD_DIM] folded into the running state of M query rows, in the log2 domain (scores scaled by sm_scale_log2 =
    sm_scale * log2 e, one fused multiply-add per score). m_i [M] is a running maximum of the scaled scores, l_i [M]
    the sum of exp2(scaled score - m_i) and acc [M, HEAD_DIM] (fp32) the sum of exp2(scaled score - m_i) * w * v,
    where w is the key's v_weight [BLOCK_N] (1, or an FP8 pool's V scale): after the last tile the output is
    acc / l_i, and m_i + log2(l_i) the rows' log2-sum-exp2 (the merge's weights). The products run in v's dtype.
    A row's first tile has at least one visible key; a later one may have none. Returns the new (m_i, l_i, acc)."""
    # BEGIN SOLUTION task6.online_softmax points=3
    m_new = tl.maximum(m_i, tl.max(s, 1) * sm_scale_log2)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * sm_scale_log2 - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = dot((p * v_weight[None, :]).to(v.dtype), v, acc * alpha[:, None], IEEE)
    # END SOLUTION
    return m_new, l_i, acc


@triton.jit
def attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block_table_ptr, b, stride_bt_b, kv_head, tile, q_pos,
                kv_len, sm_scale_log2, MASK_TAIL: tl.constexpr, CAUSAL: tl.constexpr, H_KV: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
                k_scale_ptr, v_scale_ptr, SCALE_SLOT: tl.constexpr, SCALE_HEAD: tl.constexpr):
    """One online-softmax step for query rows q [M, HEAD_DIM] over the keys at positions tile .. tile + BLOCK_N - 1
    of sequence b, read through its block table. MASK_TAIL hides keys at or past kv_len (a partial last tile);
    CAUSAL also hides keys after each row's own position q_pos [M]. Without either, the caller promises every
    key is visible. Returns the new (m_i, l_i, acc). Both attention kernels are loops over this function.

    An FP8 pool (float8_e4m3fn) is read as e4m3 values and their scales, the scales applied to the scores and the
    softmax weights (step 2): the scale of key row (slot, head) is at `slot * SCALE_SLOT + kv_head * SCALE_HEAD` in
    k_scale_ptr / v_scale_ptr (a stride of 0 shares one scale: static scales). Other pools ignore the scale
    arguments."""
    pos = tile + tl.arange(0, BLOCK_N)
    in_seq = pos < kv_len
    # 1. Where the tile's tokens live: block table lookup, then each key's `slot` = block * BLOCK_SIZE + offset (its
    # row of the pool, in int64) and the K/V offsets of the tile's (key, dim) elements.
    slot, kv_offs = tile_addresses(block_table_ptr, b, stride_bt_b, kv_head, pos, in_seq, H_KV, HEAD_DIM, BLOCK_SIZE)
    if MASK_TAIL:
        k = tl.load(k_cache_ptr + kv_offs, mask=in_seq[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_offs, mask=in_seq[:, None], other=0.0)
    else:
        k = tl.load(k_cache_ptr + kv_offs)
        v = tl.load(v_cache_ptr + kv_offs)

    # 2. Raw scores of every row against the tile; -inf where a key is hidden. `v_weight`: what each key's value row
    # is multiplied by in step 3, its V scale in an FP8 pool, else 1.
    if k_cache_ptr.dtype.element_ty == tl.float8e4nv:
        # An FP8 pool, a scale per key. The products run in q's dtype, fp16 for this pool (`compute_q`): every
        # e4m3 value is exact in it. Both scales multiply a [rows, BLOCK_N] tile, never the [BLOCK_N, HEAD_DIM] one:
        # K's the scores (q . (s k) = s (q . k)), V's the weights p (sum_j p_j (s_j v_j) = sum_j (p_j s_j) v_j), so
        # K and V go from the pool to the products with one conversion each. The weights p_j s_j reach fp16 times
        # VALUE_SCALE, a power of two that `values` divides out after the loop: a row's scale is its largest value
        # / 448, and without it every weight of a row whose values stay under 0.03 would fall below fp16's normal
        # range (6e-5) and keep fewer bits.
        scale_at = slot * SCALE_SLOT + kv_head * SCALE_HEAD
        s = dot(q, tl.trans(k.to(q.dtype)), tl.zeros([q.shape[0], BLOCK_N], tl.float32), IEEE)
        s = s * tl.load(k_scale_ptr + scale_at)[None, :]
        v = v.to(q.dtype)
        v_weight = tl.load(v_scale_ptr + scale_at) * VALUE_SCALE
    else:
        s = dot(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], tl.float32), IEEE)
        v_weight = tl.full([BLOCK_N], 1.0, tl.float32)  # weighs by 1: a multiply the compiler removes
    if MASK_TAIL:
        s = tl.where(in_seq[None, :], s, float("-inf"))
    if CAUSAL:
        s = causal_scores(s, pos, q_pos)

    # 3. Online softmax in the log2 domain: raise the running max, rescale what was accumulated under the old one,
    # add the tile (each value row weighed by `v_weight`).
    return online_softmax(m_i, l_i, acc, s, v, v_weight, sm_scale_log2, IEEE)


@triton.jit
def values(acc, k_cache_ptr):
    """The accumulator in the values' own units, after the loop over key tiles: over an FP8 pool `attend_tile`
    weighs V by its scales times VALUE_SCALE (exact: a power of two), divided out here once."""
    out = acc
    if k_cache_ptr.dtype.element_ty == tl.float8e4nv:
        out = acc * (1.0 / VALUE_SCALE)
    return out


@triton.jit
def compute_q(q, k_cache_ptr):
    """The query rows in the dtype the products run in: q's own, but fp16 over an FP8 pool (fp32 stays fp32). The
    GPU converts two e4m3 bytes into two fp16 in one instruction, where bf16 takes a detour through fp32, and fp16
    holds every e4m3 value exactly. A bf16 q keeps its value in fp16 between 6e-5 and 65,504, where a trained
    model's queries sit (beyond, it would become inf). Converted once per program, before the loop over key
    tiles."""
    out = q
    if k_cache_ptr.dtype.element_ty == tl.float8e4nv:
        if q.dtype != tl.float32:
            out = q.to(tl.float16)
    return out


@triton.jit
def split_plan(seq_lens_ptr, batch, seq_len, max_splits, min_split_len, target_programs, fill_programs,
               H_KV: tl.constexpr, BLOCK_N: tl.constexpr):
    """The launch rule, on the device: (number of splits, tokens per split) for a sequence of seq_len tokens.
    Near-uniform batch: enough splits to fill the GPU (fill_programs in all). Ragged batch: splits of the same
    length in every sequence, the batch's K/V over target_programs. Never splits under min_split_len tokens nor
    more than max_splits (the grid's third axis); whole tiles, recounted so that no split is empty."""
    total = tl.full([], 0, tl.int64)
    longest = tl.full([], 0, tl.int32)
    shortest = tl.full([], 2**31 - 1, tl.int32)
    for start in range(0, batch, 128):  # B integers, read from L2 by every program
        offs = start + tl.arange(0, 128)
        lens = tl.load(seq_lens_ptr + offs, mask=offs < batch, other=0).to(tl.int32)
        total += tl.sum(lens.to(tl.int64))
        longest = tl.maximum(longest, tl.max(lens))
        shortest = tl.minimum(shortest, tl.min(tl.where(offs < batch, lens, 2**31 - 1)))
    if shortest.to(tl.int64) * 5 >= longest.to(tl.int64) * NEAR_UNIFORM:  # equal programs already: only fill the GPU
        wanted = tl.maximum(fill_programs // (batch * H_KV), 1)
    else:  # ragged: pieces of about equal length, whatever the sequence
        split_len = tl.maximum(tl.cdiv(total * H_KV, target_programs), min_split_len)
        wanted = tl.cdiv(seq_len, split_len).to(tl.int32)
    wanted = tl.maximum(tl.minimum(tl.minimum(wanted, max_splits), tl.cdiv(seq_len, min_split_len)), 1)
    tiles = tl.maximum(tl.cdiv(seq_len, BLOCK_N), 1)
    tiles_per_split = tl.cdiv(tiles, wanted)
    return tl.cdiv(tiles, tiles_per_split), tiles_per_split * BLOCK_N


@triton.jit
def store_partial(mid_o_ptr, mid_lse_ptr, row, slot, num_slots, m_i, l_i, acc, valid, HEAD_DIM: tl.constexpr):
    """A partial result of query rows `row` [M] (each a (sequence, head) pair, `b * H_q + head`) in merge slot
    `slot`: the output normalised within its keys, and their log2-sum-exp2. The merge weighs the slots of a row by
    exp2(lse)."""
    dims = tl.arange(0, HEAD_DIM)
    mid = row.to(tl.int64) * num_slots + slot
    tl.store(mid_o_ptr + mid[:, None] * HEAD_DIM + dims[None, :], acc / l_i[:, None], mask=valid[:, None])
    tl.store(mid_lse_ptr + mid, m_i + tl.log2(l_i), mask=valid)


@triton.jit
def _decode_split_kernel(
    q_ptr,  # [B, H_q, D]
    k_cache_ptr, v_cache_ptr,  # [num_slots, H_kv, D] one layer of the pool
    k_scale_ptr, v_scale_ptr,  # an FP8 pool's scales (attend_tile, SCALE_SLOT / SCALE_HEAD); unused otherwise
    block_table_ptr,  # [B, max_blocks] int32/int64 physical block of each logical block
    seq_lens_ptr,  # [B] keys to read: the context including the new token (already stored)
    kv_start_ptr,  # [B] int32, with SUFFIX only: the position of the first key (the keys before it are read elsewhere)
    slot_base_ptr,  # [B] int32, with SUFFIX only: the first merge slot of the sequence's splits
    o_ptr,  # [B, H_q, D] output, written here by the sequences of one split (and no slot before it)
    mid_o_ptr,  # [B, H_q, num_slots, D] fp32 partial outputs (normalised within the split)
    mid_lse_ptr,  # [B, H_q, num_slots] fp32 log2-sum-exp2 of each split's scores
    num_splits_ptr,  # [B] int32: merge slots each sequence filled, for the merge
    stride_q_b, stride_o_b, stride_bt_b,
    batch, max_splits, num_slots, min_split_len, target_programs, fill_programs, sm_scale_log2,
    H_KV: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, SUFFIX: tl.constexpr,
    SCALE_SLOT: tl.constexpr, SCALE_HEAD: tl.constexpr,
):
    kv_head = tl.program_id(0)  # fastest-varying: the KV heads of the same tokens are read at the same time
    b = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)  # int32 positions keep the tile loop in 32-bit arithmetic
    num_splits, split_len = split_plan(seq_lens_ptr, batch, seq_len, max_splits, min_split_len, target_programs,
                                       fill_programs, H_KV, BLOCK_N)
    if split >= num_splits:  # the grid is sized for the longest context it may see
        return
    first = tl.full([], 0, tl.int32)  # the keys are positions first .. first + seq_len - 1
    base = tl.full([], 0, tl.int32)  # this sequence's splits fill merge slots base .. base + num_splits - 1
    if SUFFIX:  # cascade attention read the shared prefix: this pass reads the rest, and adds its slots after
        first = tl.load(kv_start_ptr + b).to(tl.int32)
        base = tl.load(slot_base_ptr + b).to(tl.int32)
    start = first + split * split_len
    end = tl.minimum(start + split_len, first + seq_len)

    # The GROUP query heads of this KV head, as rows of a [GROUP_PAD, HEAD_DIM] matrix (padding rows are 0).
    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * stride_q_b + heads[:, None] * HEAD_DIM + dims[None, :], mask=rows[:, None] < GROUP,
                other=0.0)
    q = compute_q(q, k_cache_ptr)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max of the scores (log2 domain)
    l_i = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)  # running sum of exp2(score - m_i) * v
    for tile in range(start, end, BLOCK_N):  # the new token comes after every key: only the split's end masks
        m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block_table_ptr, b, stride_bt_b,
                                    kv_head, tile, seq_len, end, sm_scale_log2, True, False, H_KV, HEAD_DIM,
                                    BLOCK_SIZE, BLOCK_N, IEEE, k_scale_ptr, v_scale_ptr, SCALE_SLOT, SCALE_HEAD)
    acc = values(acc, k_cache_ptr)

    # 4. A sequence of one split and no earlier slot: the output itself (a context of 0 tokens gives 0, not NaN).
    # Otherwise the split's normalised output and its log2-sum-exp2 (every split has keys), for the merge.
    if (num_splits == 1) & (base == 0):
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr + b * stride_o_b + heads[:, None] * HEAD_DIM + dims[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=rows[:, None] < GROUP)
    else:
        store_partial(mid_o_ptr, mid_lse_ptr, b * H_KV * GROUP + heads, base + split, num_slots, m_i, l_i, acc,
                      rows < GROUP, HEAD_DIM)
    if (kv_head == 0) & (split == 0):
        tl.store(num_splits_ptr + b, base + num_splits)


@triton.jit
def _merge_splits_kernel(
    mid_o_ptr, mid_lse_ptr, num_splits_ptr,  # as written by _decode_split_kernel (and cascade's prefix pass)
    o_ptr,  # [B, H_q, D] output, in q's dtype
    stride_o_b, num_slots,
    H_Q: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    """softmax over all keys = each split's softmax weighted by exp2(lse_split - lse_total)."""
    head = tl.program_id(0)
    b = tl.program_id(1)
    num_splits = tl.minimum(tl.load(num_splits_ptr + b), num_slots)
    if num_splits <= 1:  # the split kernel wrote this row's output itself (or no program had a row here: padding)
        return
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    row = (b * H_Q + head).to(tl.int64) * num_slots
    # BEGIN SOLUTION task6.merge points=2
    lse = tl.load(mid_lse_ptr + row + splits, mask=splits < num_splits, other=float("-inf"))
    part = tl.load(mid_o_ptr + (row + splits)[:, None] * HEAD_DIM + dims[None, :],
                   mask=(splits < num_splits)[:, None], other=0.0)
    weight = tl.exp2(lse - tl.max(lse, 0))  # slots past num_splits say lse = -inf: weight 0
    out = tl.sum(part * weight[:, None], 0) / tl.sum(weight, 0)
    # END SOLUTION
    tl.store(o_ptr + b * stride_o_b + head * HEAD_DIM + dims, out.to(o_ptr.dtype.element_ty))


def num_kv_splits(max_seq_len: int, min_split_len: int = MIN_SPLIT_LEN) -> int:
    """The grid's split axis: the most splits `split_plan` gives any sequence of at most `max_seq_len` tokens.
    A host integer from a host integer, no GPU read: in eager mode the batch's longest context; a CUDA graph
    runner captures a few axes (`split_buckets`) and replays the smallest that holds its step's (the programs past
    a shorter context's splits return at once)."""
    return max(1, min(cdiv(max_seq_len, min_split_len), MAX_SPLITS))


def split_buckets(max_context: int) -> list[int]:
    """The split axes a CUDA-graph runner captures each decode batch size with: powers of four, up to the axis of
    the longest context it will replay. A replay takes the smallest axis that covers its step's longest context
    (`split_bucket`), so its grid is at most four times what the step uses, where one axis sized for the longest
    context launches up to 64 times more programs than a batch of short contexts needs (each one reading the
    batch's lengths before it returns); and a step whose contexts all fit one split runs no merge."""
    top = num_kv_splits(max_context)
    return [s for s in (1, 4, 16) if s < top] + [top]


def split_bucket(buckets: list[int], max_seq_len: int) -> int:
    """The smallest captured split axis (`split_buckets`) that holds every split of a context of max_seq_len (the
    widest for a longer one: the launch rule never splits past the grid's axis, so its splits grow longer)."""
    need = num_kv_splits(max_seq_len)
    return next((s for s in buckets if s >= need), buckets[-1])


def split_plan_host(seq_lens: list[int], num_kv_heads: int, max_splits: int, block_n: int = 64,
                    num_sms: int = H200_SMS, min_split_len: int = MIN_SPLIT_LEN) -> list[tuple[int, int]]:
    """`split_plan` in Python, for the lesson and the tests: (splits, tokens per split) per sequence."""
    batch, total = len(seq_lens), sum(seq_lens)
    plan = []
    for n in seq_lens:
        if min(seq_lens) * 5 >= max(seq_lens) * NEAR_UNIFORM.value:
            wanted = max(FILL_PER_SM * num_sms // (batch * num_kv_heads), 1)
        else:
            wanted = cdiv(n, max(cdiv(total * num_kv_heads, PROGRAMS_PER_SM * num_sms), min_split_len))
        wanted = max(min(wanted, max_splits, cdiv(n, min_split_len)), 1)
        tiles = max(cdiv(n, block_n), 1)
        per = cdiv(tiles, wanted)
        plan.append((cdiv(tiles, per), per * block_n))
    return plan


@dataclass(frozen=True)
class Partials:
    """Merge slots: for every (sequence, query head), `num_slots` partial outputs with their log2-sum-exp2, and per
    sequence how many slots it filled. Split-KV fills them with the splits of a context; cascade attention (cascade.py)
    with the splits of a shared prefix first, then those of each sequence's own suffix. One merge reads them all."""

    mid_o: torch.Tensor  # [B, H_q, num_slots, D] fp32
    mid_lse: torch.Tensor  # [B, H_q, num_slots] fp32
    num_splits: torch.Tensor  # [B] int32

    @classmethod
    def empty(cls, batch: int, num_heads: int, head_dim: int, num_slots: int, device: torch.device) -> Partials:
        return cls(torch.empty(batch, num_heads, num_slots, head_dim, dtype=torch.float32, device=device),
                   torch.empty(batch, num_heads, num_slots, dtype=torch.float32, device=device),
                   torch.empty(batch, dtype=torch.int32, device=device))

    @property
    def num_slots(self) -> int:
        return self.mid_lse.shape[-1]


def check_decode_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                        seq_lens: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The shared checks (launch.py) for a decode batch q [B, H_q, D] with one context length per row; returns
    `out`, made like q when not given."""
    if seq_lens.shape != (q.shape[0],):
        raise ValueError(f"seq_lens {tuple(seq_lens.shape)} vs batch {q.shape[0]}")
    return check_attention_inputs(q, k_cache, v_cache, block_table, q.shape[0], out)


def decode_splits(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                  seq_lens: torch.Tensor, max_splits: int, out: torch.Tensor, partials: Partials,
                  kv_start: torch.Tensor | None = None, slot_base: torch.Tensor | None = None, *,
                  kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None, num_sms: int | None = None,
                  min_split_len: int = MIN_SPLIT_LEN, block_n: int | None = None, num_warps: int | None = None,
                  num_stages: int = 3) -> None:
    """Stage 1: every sequence's keys cut into splits by the launch rule, each split's partial result in a merge
    slot (or, for a sequence of one split and no slot before it, straight into `out`). With `kv_start` and
    `slot_base` (cascade's suffix pass) sequence b reads the `seq_lens[b]` keys from position `kv_start[b]` on,
    and its splits take the slots from `slot_base[b]` on. A float8_e4m3fn pool takes its layer's `kv_scales`
    (store_kvcache.py's `scale_layout`)."""
    B, Hq, D = q.shape
    _, block_size, Hkv, _ = k_cache.shape
    if not 1 <= max_splits <= MAX_SPLITS:
        raise ValueError(f"max_splits must be in 1..{MAX_SPLITS}, got {max_splits}")
    suffix = kv_start is not None
    k_scale, v_scale, scale_slot, scale_head = kernel_scales(k_cache, kv_scales)
    sms = num_sms or sm_count(q.device)
    tile_n, warps = (DECODE_TILE_FP8 if k_cache.dtype == fp8_pool.FP8 else DECODE_TILE).get(D, (64, 4))
    group = Hq // Hkv
    _decode_split_kernel[(Hkv, B, max_splits)](
        q, k_cache, v_cache, k_scale, v_scale, block_table, seq_lens, kv_start if suffix else seq_lens,
        slot_base if suffix else seq_lens, out, partials.mid_o, partials.mid_lse, partials.num_splits,
        q.stride(0), out.stride(0), block_table.stride(0), B, max_splits, partials.num_slots, min_split_len,
        PROGRAMS_PER_SM * sms, FILL_PER_SM * sms, LOG2E / math.sqrt(D),
        H_KV=Hkv, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=D,
        BLOCK_SIZE=block_size, BLOCK_N=block_n or tile_n, IEEE=q.dtype == torch.float32, SUFFIX=suffix,
        SCALE_SLOT=scale_slot, SCALE_HEAD=scale_head, num_warps=num_warps or warps, num_stages=num_stages)


def merge_partials(partials: Partials, out: torch.Tensor) -> None:
    """Stage 2: every sequence that filled more than one slot gets the merge of its slots in `out`."""
    B, Hq, D = out.shape
    _merge_splits_kernel[(Hq, B)](partials.mid_o, partials.mid_lse, partials.num_splits, out, out.stride(0),
                                  partials.num_slots, H_Q=Hq, HEAD_DIM=D,
                                  SPLITS_PAD=max(2, triton.next_power_of_2(partials.num_slots)))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                           seq_lens: torch.Tensor, max_splits: int | None = None, out: torch.Tensor | None = None,
                           partials: Partials | None = None, **tuning) -> torch.Tensor:
    """q [B, H_q, D] (the one new token of each sequence); k_cache/v_cache one layer of the pool
    [num_blocks, block_size, H_kv, D]; block_table [B, max_blocks] (int32 or int64); seq_lens [B] >= 1,
    counting the new token, whose K/V must already be stored. Returns [B, H_q, D].

    `max_splits` is the grid's split axis, a host integer: `num_kv_splits(longest context)`, by default the
    bound for the block table's width. The lengths are read on the device only, so the launch can be captured
    in a CUDA graph and replayed with other `seq_lens`. `partials` (at least `max_splits` slots) lets a caller
    reuse one buffer for every layer of a step instead of allocating one per launch. `tuning` (`decode_splits`'s
    keywords): `num_sms` (default: the device's) and `min_split_len` set the rule; the tile and warp defaults
    (`DECODE_TILE`; `DECODE_TILE_FP8` over an FP8 pool, from `benchmarks/step06/fp8.py`) are the best of
    `benchmarks/step06/kernels.py --part sweep` on an H200; `kv_scales`, a float8_e4m3fn
    pool's scales of the layer."""
    out = check_decode_inputs(q, k_cache, v_cache, block_table, seq_lens, out)
    if max_splits is None:
        max_splits = num_kv_splits(block_table.shape[1] * k_cache.shape[1], tuning.get("min_split_len",
                                                                                       MIN_SPLIT_LEN))
    B, Hq, D = q.shape
    if B == 0:
        return out
    if partials is None or partials.num_slots < max_splits or partials.mid_o.shape[:2] != (B, Hq):
        partials = Partials.empty(B, Hq, D, max_splits, q.device)  # untouched with one split
    decode_splits(q, k_cache, v_cache, block_table, seq_lens, max_splits, out, partials, **tuning)
    if max_splits > 1:  # with one split every sequence was written by the first kernel
        merge_partials(partials, out)
    return out
