"""Each kernel against the torch path it replaces (chapter 2's slots, chapter 1's `attention` over the gathered
K/V): partial last blocks, blocks of 1 and 16, contexts of one token and of many blocks, the decode launch
rule's edge cases (the plan on the device against the host's), GQA groups 1, 3 (SmolLM2), 4 and 8, head_dim
64 and 128, slot -1; fp32 and fp16. On a CPU the kernels run through Triton's interpreter (conftest.py turns it
on; shapes stay tiny); on a GPU the same tests run compiled.

Each homework task's own tests reach only its body, with inputs the test builds: a small kernel written here calls
the building block (`tile_addresses`, `causal_scores`, `online_softmax`) as the attention kernels do, and the merge
runs on partial results computed here in torch. The tests of whole kernels run several tasks and carry the marker
of each (end to end)."""
from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from step01_kvcache.attention import attention
from step06_triton.decode_attention import (
    FILL_PER_SM,
    MAX_SPLITS,
    MIN_SPLIT_LEN,
    PROGRAMS_PER_SM,
    Partials,
    causal_scores,
    merge_partials,
    num_kv_splits,
    online_softmax,
    paged_decode_attention,
    split_bucket,
    split_buckets,
    split_plan,
    split_plan_host,
    tile_addresses,
)
from step06_triton.extend_attention import extend_attention, extend_splits
from step06_triton.store_kvcache import store_kvcache

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


class Pool:
    """One layer of a paged pool with random contents and, per sequence, a block table of scattered blocks."""

    def __init__(self, lengths: list[int], block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, seed: int = 0, spare_blocks: int = 3) -> None:
        g = torch.Generator().manual_seed(seed)
        need = [-(-n // block_size) for n in lengths]
        num_blocks = sum(need) + spare_blocks
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.randn(shape, generator=g).to(DEVICE, dtype)
        self.v = torch.randn(shape, generator=g).to(DEVICE, dtype)
        order = torch.randperm(num_blocks, generator=g).tolist()
        self.tables, start = [], 0
        for n in need:
            self.tables.append(order[start: start + n])
            start += n
        width = max(need)
        self.block_table = torch.tensor([t + [0] * (width - len(t)) for t in self.tables], dtype=torch.int32,
                                        device=DEVICE)
        self.lengths, self.block_size = lengths, block_size
        self.seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)

    def gathered(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence i's K/V [len, H_kv, D], read position by position through its block table (the torch path)."""
        pos = torch.arange(self.lengths[i])
        slots = torch.tensor(self.tables[i])[pos // self.block_size] * self.block_size + pos % self.block_size
        flat = lambda t: t.view(-1, t.shape[-2], t.shape[-1])  # noqa: E731
        return flat(self.k)[slots.to(DEVICE)], flat(self.v)[slots.to(DEVICE)]


def reference_decode(pool: Pool, q: torch.Tensor) -> torch.Tensor:
    rows = []
    for i in range(q.shape[0]):
        k, v = pool.gathered(i)
        rows.append(attention(q[i: i + 1].float(), k.float(), v.float(), None).view(q.shape[1:]))
    return torch.stack(rows)


def reference_extend(pool: Pool, q: torch.Tensor, q_lens: list[int]) -> torch.Tensor:
    rows, start = [], 0
    for i, n in enumerate(q_lens):
        k, v = pool.gathered(i)
        ctx = pool.lengths[i]
        q_pos = torch.arange(ctx - n, ctx, device=DEVICE)
        mask = torch.arange(ctx, device=DEVICE)[None, :] > q_pos[:, None]  # bottom-right causal
        rows.append(attention(q[start: start + n].float(), k.float(), v.float(), mask).view(n, *q.shape[1:]))
        start += n
    return torch.cat(rows)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(out).all(), "the kernel wrote NaN/inf (or left a row unwritten)"
    err = float((out.double() - ref.double()).norm() / ref.double().norm())
    assert err < TOL[dtype], f"relative error {err:.2e} >= {TOL[dtype]:.0e}"


def poisoned(shape, dtype) -> torch.Tensor:
    """An output buffer full of NaN: any element the kernel forgets to write fails the check."""
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


# ---- store_kvcache -----------------------------------------------------------------------------------------
@pytest.mark.task("task6.store")
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 64), (3, 64), (2, 128)])
def test_store_scatters_rows_and_skips_slot_minus_one(block_size, num_kv_heads, head_dim):
    g = torch.Generator().manual_seed(block_size + head_dim)
    num_blocks = 6
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(DEVICE)
    v_cache = torch.randn(k_cache.shape, generator=g).to(DEVICE)
    T = 5
    k = torch.randn(T, num_kv_heads, head_dim, generator=g).to(DEVICE)
    v = torch.randn(T, num_kv_heads, head_dim, generator=g).to(DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:T]
    slots[1] = -1  # a padding row: stored nowhere
    expect_k, expect_v = k_cache.clone().view(-1, num_kv_heads, head_dim), v_cache.clone().view(-1, num_kv_heads,
                                                                                                 head_dim)
    keep = slots >= 0
    expect_k[slots[keep]] = k[keep.to(DEVICE)]
    expect_v[slots[keep]] = v[keep.to(DEVICE)]
    store_kvcache(k, v, k_cache, v_cache, slots.to(DEVICE))
    assert torch.equal(k_cache.view_as(expect_k), expect_k) and torch.equal(v_cache.view_as(expect_v), expect_v)


def test_store_rejects_mismatched_shapes():
    cache = torch.zeros(2, 4, 2, 16, device=DEVICE)
    k = torch.zeros(3, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="slot_mapping"):
        store_kvcache(k, k, cache, cache.clone(), torch.zeros(2, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="shape mismatch"):
        store_kvcache(k, k, torch.zeros(2, 4, 3, 16, device=DEVICE), cache, torch.zeros(3, dtype=torch.long,
                                                                                            device=DEVICE))


# ---- paged decode ------------------------------------------------------------------------------------------
# The launch rule splits by work: tiny contexts split only on a tiny GPU (one SM) with short splits allowed.
SPLIT_ALL = dict(min_split_len=16, num_sms=1, block_n=16)

# The tests of whole kernels carry the marker of every task whose body they run (and wait for their stubs): decode
# runs the address, the online softmax and, where a sequence has several splits, the merge; extend the causal mask
# too.


# ---- the building blocks, each alone ---------------------------------------------------------------------------
LN2 = math.log(2)


def softmax2(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The softmax of scores in the log2 domain (exp2), in float64."""
    return torch.softmax(x.double() * LN2, dim)


def lse2(x: torch.Tensor, dim: int) -> torch.Tensor:
    """log2 of the sum of exp2 of x, in float64."""
    return torch.logsumexp(x.double() * LN2, dim) / LN2

@triton.jit
def _address_kernel(block_table_ptr, seq_lens_ptr, starts_ptr, slot_ptr, offs_ptr, stride_bt_b, TILES: tl.constexpr,
                    H_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    b, kv_head, t = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    pos = tl.load(starts_ptr + t) + tl.arange(0, BLOCK_N)
    in_seq = pos < tl.load(seq_lens_ptr + b)
    slot, kv_offs = tile_addresses(block_table_ptr, b, stride_bt_b, kv_head, pos, in_seq, H_KV, HEAD_DIM, BLOCK_SIZE)
    keys = ((b * H_KV + kv_head) * TILES + t).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(slot_ptr + keys, slot)
    tl.store(offs_ptr + keys[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], kv_offs)


@pytest.mark.task("task6.address")
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_tile_addresses_follow_the_block_table(block_size):
    """Tiles of 16 keys from any first position (decode's splits start on a tile, extend's causal part after the
    prefix), for 3 sequences of ragged lengths in scattered blocks, block ids large enough that a key's element
    lies past 2^31 (int64 before multiplying), a block table whose rows are wider than their blocks and whose
    entries past a sequence's blocks are garbage (never read): each key's slot and the offsets of its head's
    elements in [num_slots, H_kv, D], against the page-table lookup written here."""
    lengths, n, hkv, d = [37, 1, 20], 16, 2, 16
    g = torch.Generator().manual_seed(block_size)
    need = [-(-length // block_size) for length in lengths]
    blocks = (torch.randperm(sum(need) + 5, generator=g) + 2**31 // (block_size * hkv * d)).tolist()
    garbage = 2**30  # read for a key past its sequence, it would put the key far outside the pool
    table = torch.full((len(lengths), max(need) + 3), garbage, dtype=torch.int32)
    tables = []
    for i, k in enumerate(need):
        tables.append(blocks[sum(need[:i]): sum(need[:i]) + k])
        table[i, :k] = torch.tensor(tables[-1], dtype=torch.int32)
    width = max(need)  # the kernel sees the first `width` columns; the rest of each row is garbage too
    starts = [0, 16, 32, 5, 27]
    slots = torch.full((len(lengths), hkv, len(starts), n), -1, dtype=torch.int64)
    offs = torch.full((*slots.shape, d), -1, dtype=torch.int64)
    _address_kernel[(len(lengths), hkv, len(starts))](
        table[:, :width].to(DEVICE), torch.tensor(lengths, dtype=torch.int32, device=DEVICE),
        torch.tensor(starts, dtype=torch.int32, device=DEVICE), slots.to(DEVICE), offs.to(DEVICE), table.stride(0),
        TILES=len(starts), H_KV=hkv, HEAD_DIM=d, BLOCK_SIZE=block_size, BLOCK_N=n)
    num_slots = (max(blocks) + 1) * block_size
    for i, length in enumerate(lengths):
        for h in range(hkv):
            for t, start in enumerate(starts):
                for j, pos in enumerate(range(start, start + n)):
                    got = int(slots[i, h, t, j])
                    if pos >= length:
                        assert 0 <= got < num_slots, f"a key past sequence {i}'s end has slot {got}, outside the pool"
                        continue
                    slot = tables[i][pos // block_size] * block_size + pos % block_size
                    assert got == slot, f"sequence {i}, position {pos}: slot {got}, not {slot}"
                    want = slot * hkv * d + h * d + torch.arange(d)
                    assert torch.equal(offs[i, h, t, j].cpu(), want), f"sequence {i}, head {h}, position {pos}"


@triton.jit
def _causal_kernel(s_ptr, q_pos_ptr, tiles_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr):
    c = tl.program_id(0)
    rows, cols = tl.arange(0, M), tl.arange(0, N)
    at = c * M * N + rows[:, None] * N + cols[None, :]
    s = causal_scores(tl.load(s_ptr + at), tl.load(tiles_ptr + c) + cols, tl.load(q_pos_ptr + c * M + rows))
    tl.store(out_ptr + at, s)


@pytest.mark.task("task6.causal")
def test_causal_scores_hide_the_keys_after_each_row():
    """16 query rows at consecutive positions after a prefix (a chunk), or at any positions, against tiles of 16 keys
    before them, across their diagonal and after them: a score stays where its key's position is at most its row's,
    and is -inf elsewhere; a score already -inf (a key past the sequence) stays -inf."""
    m = n = 16
    cases = [(40, torch.arange(40, 56)), (32, torch.arange(40, 56)), (48, torch.arange(40, 56)),
             (64, torch.arange(40, 56)), (0, torch.arange(0, 16)), (3, torch.randint(0, 30, (16,)))]
    g = torch.Generator().manual_seed(0)
    s = torch.randn(len(cases), m, n, generator=g)
    s[:, :, -3:] = float("-inf")
    q_pos = torch.stack([q for _, q in cases]).to(torch.int32)
    tiles = torch.tensor([t for t, _ in cases], dtype=torch.int32)
    out = torch.full_like(s, float("nan"))
    _causal_kernel[(len(cases),)](s.to(DEVICE), q_pos.to(DEVICE), tiles.to(DEVICE), out.to(DEVICE), M=m, N=n)
    keys = tiles[:, None, None] + torch.arange(n)[None, None, :]
    want = torch.where(keys <= q_pos[:, :, None], s, float("-inf"))
    for c, (tile, _) in enumerate(cases):
        assert torch.equal(out[c].cpu(), want[c]), f"rows at {q_pos[c].tolist()} against keys {tile}..{tile + n - 1}"


@triton.jit
def _softmax_kernel(s_ptr, v_ptr, w_ptr, out_ptr, lse_ptr, num_tiles, sm_scale_log2, M: tl.constexpr,
                    N: tl.constexpr, D: tl.constexpr, IEEE: tl.constexpr):
    rows, cols, dims = tl.arange(0, M), tl.arange(0, N), tl.arange(0, D)
    m_i = tl.full([M], float("-inf"), tl.float32)
    l_i = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, D], tl.float32)
    for t in range(0, num_tiles):
        s = tl.load(s_ptr + t * M * N + rows[:, None] * N + cols[None, :])
        v = tl.load(v_ptr + (t * N + cols)[:, None] * D + dims[None, :])
        m_i, l_i, acc = online_softmax(m_i, l_i, acc, s, v, tl.load(w_ptr + t * N + cols), sm_scale_log2, IEEE)
    tl.store(out_ptr + rows[:, None] * D + dims[None, :], acc / l_i[:, None])
    tl.store(lse_ptr + rows, m_i + tl.log2(l_i))


@pytest.mark.task("task6.online_softmax")
@pytest.mark.parametrize("weights,dtype", [("ones", torch.float32), ("scales", torch.float32),
                                           ("scales", torch.float16)])
def test_online_softmax_over_tiles_is_the_softmax_of_all_keys(weights, dtype):
    """4 tiles of 16 keys for 16 query rows, folded one after the other: raw scores that grow from tile to tile in
    some rows and shrink in others (the running max moves, what was accumulated must be rescaled), large enough that
    exp2 of a scaled score overflows fp32, hidden keys (-inf) in every tile and a whole later tile hidden from some
    rows; each value row weighed by 1 or by a scale (an FP8 pool's), values in fp32 or fp16. After the last tile
    acc / l_i is the softmax-weighted sum of the weighed values over all keys, and m_i + log2(l_i) the rows'
    log2-sum-exp2 of the scaled scores (what the merge weighs splits by), against torch written here."""
    m, n, d, tiles, scale = 16, 16, 32, 4, 0.125 * 1.4426950408889634
    g = torch.Generator().manual_seed(len(weights) + dtype.itemsize)
    trend = torch.linspace(-1, 1, m)[:, None, None] * torch.arange(tiles)[None, :, None] * 300  # up or down
    s = (torch.randn(m, tiles, n, generator=g) * 40 + 1200 + trend)
    s[torch.rand(s.shape, generator=g) < 0.25] = float("-inf")
    s[:, 0, 0] = 1200.0  # every row sees a key of its first tile
    s[:4, 2] = float("-inf")  # a tile these rows see nothing of
    v = torch.randn(tiles * n, d, generator=g).to(dtype)
    w = torch.ones(tiles * n) if weights == "ones" else torch.rand(tiles * n, generator=g) * 2 + 0.01
    out, lse = torch.full((m, d), float("nan")), torch.full((m,), float("nan"))
    out, lse = out.to(DEVICE), lse.to(DEVICE)
    _softmax_kernel[(1,)](s.permute(1, 0, 2).contiguous().to(DEVICE), v.to(DEVICE), w.to(DEVICE), out, lse, tiles,
                          scale, M=m, N=n, D=d, IEEE=dtype == torch.float32)
    x = s.reshape(m, tiles * n).double() * scale
    want, want_lse = softmax2(x, 1) @ (w[:, None] * v.float()).double(), lse2(x, 1)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "a row overflowed or was left NaN"
    err = float((out.cpu().double() - want).norm() / want.norm())
    assert err < (1e-5 if dtype == torch.float32 else 2e-3), f"relative error {err:.1e} of acc / l_i"
    torch.testing.assert_close(lse.cpu().double(), want_lse, rtol=1e-6, atol=1e-3)


@pytest.mark.task("task6.merge")
@pytest.mark.parametrize("num_slots", [4, 5])
def test_merge_weighs_each_split_by_its_log_sum_exp(num_slots):
    """Partial results written here in torch, as the split kernel leaves them: for every sequence and head, its keys
    cut into 1 to num_slots splits of uneven lengths, each split's softmax-normalised output and its log2-sum-exp2
    (some far past exp2's fp32 range), the slots past a sequence's splits full of garbage (NaN outputs, huge lse).
    The merge gives the softmax over all of the keys, rows of one split untouched (the split kernel wrote them)."""
    heads, d = 3, 16
    splits = [2, 1, num_slots, 3]
    g = torch.Generator().manual_seed(num_slots)
    partials = Partials.empty(len(splits), heads, d, num_slots, torch.device("cpu"))
    partials.mid_o.fill_(float("nan"))
    partials.mid_lse.fill_(1e4)
    partials.num_splits.copy_(torch.tensor(splits, dtype=torch.int32))
    want = torch.empty(len(splits), heads, d, dtype=torch.float64)
    for b, k in enumerate(splits):
        for h in range(heads):
            cuts = torch.randint(1, 9, (k,), generator=g)  # keys per split
            x = torch.randn(int(cuts.sum()), generator=g, dtype=torch.float64) * 3 + 150 * (h + 1)  # scaled scores
            v = torch.randn(int(cuts.sum()), d, generator=g, dtype=torch.float64)
            want[b, h] = softmax2(x, 0) @ v
            for j, (xs, vs) in enumerate(zip(x.split(cuts.tolist()), v.split(cuts.tolist()))):
                partials.mid_o[b, h, j], partials.mid_lse[b, h, j] = softmax2(xs, 0) @ vs, lse2(xs, 0)
    written = torch.randn(len(splits), heads, d, generator=g)  # what the split kernel wrote for its one-split rows
    out = written.clone().to(DEVICE)
    merge_partials(Partials(partials.mid_o.to(DEVICE), partials.mid_lse.to(DEVICE), partials.num_splits.to(DEVICE)),
                   out)
    out = out.cpu()
    for b, k in enumerate(splits):
        if k == 1:
            assert torch.equal(out[b], written[b]), "a row of one split was overwritten"
            continue
        assert torch.isfinite(out[b]).all(), f"sequence {b} ({k} splits): NaN/inf, a garbage slot read or exp2 overflow"
        torch.testing.assert_close(out[b].double(), want[b], rtol=1e-5, atol=1e-5,
                                   msg=lambda e, b=b, k=k: f"sequence {b}, {k} splits: {e}")


def test_device_and_host_split_rules_agree_on_a_sweep():
    """One rule, two callers: the kernels' `split_plan` and the host's `split_plan_host` (the lesson's, the graph
    runner's buckets') give every context length of a sweep the same plan, ragged and near-uniform, split-bound or
    not, on a small GPU and on an H200's 132 SMs."""
    ragged = list(range(0, 2049, 3))  # 683 sequences, every third length: each is planned against the same total
    pairs = [[n, n * r // 10] for n in range(1, 2049, 131) for r in (9, 8, 7)]  # near-uniform, the edge, ragged
    for lengths in (ragged, *pairs):
        for max_splits, num_sms in ((4, 2), (MAX_SPLITS, 132)):
            seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
            plan = torch.full((len(lengths), 2), -1, dtype=torch.int64, device=DEVICE)
            plan_on_device(seq_lens, plan, max_splits, num_sms)
            assert [tuple(r) for r in plan.tolist()] == split_plan_host(lengths, 2, max_splits, 16, num_sms, 16), \
                f"the device and the host split {lengths[:4]}... differently"


@pytest.mark.task("task6.address")
@pytest.mark.task("task6.online_softmax")
@pytest.mark.task("task6.merge")
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_decode_matches_torch_on_ragged_contexts(block_size, group):
    lengths = [1, 16, 37, 70]  # one token, exactly one block of 16, partial last blocks, many blocks
    pool = Pool(lengths, block_size, num_kv_heads=2, head_dim=64, seed=group)
    q = torch.randn(len(lengths), 2 * group, 64, device=DEVICE)
    out = poisoned(q.shape, q.dtype)
    assert [n for n, _ in split_plan_host(lengths, 2, 8, 16, 1, 16)] == [1, 1, 3, 5]
    paged_decode_attention(q, pool.k, pool.v, pool.block_table, pool.seq_lens, 8, out=out, **SPLIT_ALL)
    assert_close(out, reference_decode(pool, q), torch.float32)


@triton.jit
def _plan_kernel(seq_lens_ptr, plan_ptr, batch, max_splits, min_split_len, target_programs, fill_programs,
                 H_KV: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    n, split_len = split_plan(seq_lens_ptr, batch, tl.load(seq_lens_ptr + b), max_splits, min_split_len,
                              target_programs, fill_programs, H_KV, BLOCK_N)
    tl.store(plan_ptr + 2 * b, n)
    tl.store(plan_ptr + 2 * b + 1, split_len)


def plan_on_device(seq_lens: torch.Tensor, plan: torch.Tensor, max_splits: int, num_sms: int) -> None:
    """`split_plan` of every sequence into `plan` [B, 2], with the launch's targets as the decode computes them
    (a jit function reads only constexpr globals, so the targets come in as arguments, as in the decode kernel)."""
    _plan_kernel[(seq_lens.shape[0],)](seq_lens, plan, seq_lens.shape[0], max_splits, 16, PROGRAMS_PER_SM * num_sms,
                                       FILL_PER_SM * num_sms, H_KV=2, BLOCK_N=16)


@pytest.mark.parametrize("lengths,max_splits,num_sms", [
    ([1, 300], 16, 1),  # a 1-token sequence beside a long one: one split against many
    ([20], 8, 4),  # more splits in the grid than tiles in the context: the rule asks only for what has keys
    ([5, 3, 1], 8, 1),  # every split but the first empty: one program per sequence
    ([300, 10], 3, 4),  # the grid caps the splits: they grow longer instead
    ([0, 40], 4, 4),  # an empty context still gets its one split (which writes 0)
    ([64, 60, 57], 8, 1),  # within 20%: split only to fill the GPU (4 programs per SM)
    ([64, 60, 57], 8, 64),  # ... a big GPU: as many as min_split_len allows
    (list(range(1, 301)), 8, 8),  # more sequences than one 128-wide load: the total is summed in a loop
])
def test_device_split_plan_is_the_host_rule(lengths, max_splits, num_sms):
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    plan = torch.full((len(lengths), 2), -1, dtype=torch.int64, device=DEVICE)
    plan_on_device(seq_lens, plan, max_splits, num_sms)
    expect = split_plan_host(lengths, 2, max_splits, 16, num_sms, 16)
    assert [tuple(r) for r in plan.tolist()] == expect
    for n, (splits, split_len) in zip(lengths, expect):
        assert 1 <= splits <= max_splits and split_len % 16 == 0
        assert (splits - 1) * split_len < max(n, 1) <= splits * split_len, "each split has keys; they cover it all"


@pytest.mark.task("task6.address")
@pytest.mark.task("task6.online_softmax")
@pytest.mark.parametrize("lengths,max_splits", [
    pytest.param([1, 300], 16, marks=pytest.mark.task("task6.merge")),
    pytest.param([20, 3], 8, marks=pytest.mark.task("task6.merge")),
    ([5, 3, 1], 8),  # one split each: no merge
    pytest.param([300], 3, marks=pytest.mark.task("task6.merge")),
])
def test_decode_edge_cases_of_the_launch_rule(lengths, max_splits):
    """A 1-token sequence beside a long one, more splits than tiles, every split empty but one, a capped grid."""
    pool = Pool(lengths, block_size=4, num_kv_heads=1, head_dim=64, seed=max_splits)
    q = torch.randn(len(lengths), 3, 64, device=DEVICE)
    out = poisoned(q.shape, q.dtype)
    paged_decode_attention(q, pool.k, pool.v, pool.block_table, pool.seq_lens, max_splits, out=out,
                           min_split_len=16, num_sms=1, block_n=16)
    assert_close(out, reference_decode(pool, q), torch.float32)


def test_decode_of_an_empty_context_is_zero():
    pool = Pool([1, 9], block_size=4, num_kv_heads=1, head_dim=64)
    q = torch.randn(2, 1, 64, device=DEVICE)
    out = paged_decode_attention(q, pool.k, pool.v, pool.block_table, torch.tensor([0, 9], device=DEVICE), 4,
                                 **SPLIT_ALL)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert_close(out[1:], reference_decode(pool, q)[1:], torch.float32)


def test_decode_grid_fixed_for_a_longer_context_gives_the_same_answer():
    """As in a CUDA graph: the grid, block table width and batch are sized for more than this step needs; the
    lengths change on the device only. int64 block tables too."""
    pool = Pool([40, 7], block_size=4, num_kv_heads=2, head_dim=64, seed=5)
    q = torch.randn(2, 6, 64, device=DEVICE)
    exact = paged_decode_attention(q, pool.k, pool.v, pool.block_table, pool.seq_lens, num_kv_splits(40, 16),
                                   **SPLIT_ALL)
    wide = torch.zeros(2, 32, dtype=torch.int64, device=DEVICE)
    wide[:, : pool.block_table.shape[1]] = pool.block_table
    fixed = paged_decode_attention(q, pool.k, pool.v, wide, pool.seq_lens, **SPLIT_ALL)  # bound from the width
    assert_close(exact, reference_decode(pool, q), torch.float32)
    # the same splits, so the same sums; a GPU compiles a kernel per block-table dtype and merges over a wider slot
    # axis, which may round the last bit differently (the interpreter does not)
    torch.testing.assert_close(fixed, exact, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_head_dim_128_and_fp16(dtype):
    pool = Pool([9, 33], block_size=16, num_kv_heads=2, head_dim=128, dtype=dtype, seed=3)
    q = torch.randn(2, 8, 128, device=DEVICE).to(dtype)
    out = paged_decode_attention(q, pool.k, pool.v, pool.block_table, pool.seq_lens, 2, **SPLIT_ALL)
    assert out.dtype == dtype
    assert_close(out, reference_decode(pool, q), dtype)


def test_decode_rejects_bad_input():
    pool = Pool([4], block_size=4, num_kv_heads=2, head_dim=64)
    with pytest.raises(ValueError, match="grouped"):
        paged_decode_attention(torch.zeros(1, 3, 64, device=DEVICE), pool.k, pool.v, pool.block_table,
                               pool.seq_lens, 1)
    with pytest.raises(ValueError, match="max_splits"):
        paged_decode_attention(torch.zeros(1, 4, 64, device=DEVICE), pool.k, pool.v, pool.block_table,
                               pool.seq_lens, 0)
    with pytest.raises(ValueError, match="head_dim"):
        odd = torch.zeros(1, 4, 2, 24, device=DEVICE)
        paged_decode_attention(torch.zeros(1, 2, 24, device=DEVICE), odd, odd, pool.block_table, pool.seq_lens, 1)


def test_a_ragged_batch_is_cut_by_work_a_uniform_one_only_to_fill_the_gpu():
    ragged = [8192, 4096, 100, 1] * 16  # what an engine runs: a few long contexts among short ones
    want = -(-sum(ragged) * 8 // (PROGRAMS_PER_SM * 132))  # tokens per program if the K/V were cut evenly
    plan = split_plan_host(ragged, 8, 64, 64)
    assert plan[:4] == [(11, 768), (6, 704), (1, 128), (1, 64)]  # long contexts split, short ones stay whole
    assert all(length <= want + 64 for _, length in plan), "no split much longer than the even cut"
    assert set(split_plan_host([4096] * 64, 8, 64, 64)) == {(1, 4096)}  # 512 equal programs fill 132 SMs
    assert set(split_plan_host([32768] * 8, 8, 64, 64)) == {(8, 4096)}  # 64 do not: 8 splits, 4 per SM
    # within 20% but 12 x 8 programs cannot fill 132 SMs: split, but never under min_split_len (512) tokens
    assert set(split_plan_host([1000, 1100, 1200] * 4, 8, 64, 64)) == {(2, 512), (3, 384), (3, 448)}
    assert num_kv_splits(8192) == 16 and num_kv_splits(100) == 1  # the grid: enough for the longest context
    assert num_kv_splits(10**6) == 64  # capped: the merge holds every split in registers


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20000), min_size=1, max_size=40), st.sampled_from([1, 3, 8]),
       st.sampled_from([16, 64]), st.integers(1, 200))
def test_num_kv_splits_bounds_every_plan(lengths, heads, block_n, num_sms):
    """The host's grid, from the longest context alone, always has room for the device's plan."""
    bound = num_kv_splits(max(lengths))
    plan = split_plan_host(lengths, heads, bound, block_n, num_sms)
    assert max(n for n, _ in plan) <= bound
    assert split_plan_host(lengths, heads, MAX_SPLITS, block_n, num_sms) == plan, "the bound never binds"


# ---- prefill with prefix -----------------------------------------------------------------------------------
@pytest.mark.task("task6.address")
@pytest.mark.task("task6.online_softmax")
@pytest.mark.task("task6.causal")
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_extend_matches_torch_with_cached_prefixes(block_size, group):
    """Sequences with no prefix, a prefix inside a block, one of several blocks, and a single new token."""
    q_lens = [20, 5, 17, 1]
    lengths = [20, 11, 50, 33]  # prefixes 0, 6, 33, 32
    pool = Pool(lengths, block_size, num_kv_heads=2, head_dim=64, seed=10 + group)
    q = torch.randn(sum(q_lens), 2 * group, 64, device=DEVICE)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    out = poisoned(q.shape, q.dtype)
    extend_attention(q, pool.k, pool.v, pool.block_table, qsl, pool.seq_lens, max(q_lens), out=out, block_m=16,
                     block_n=16)
    assert_close(out, reference_extend(pool, q, q_lens), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extend_head_dim_128_and_fp16(dtype):
    q_lens, lengths = [7, 18], [7, 40]
    pool = Pool(lengths, block_size=16, num_kv_heads=1, head_dim=128, dtype=dtype, seed=4)
    q = torch.randn(sum(q_lens), 3, 128, device=DEVICE).to(dtype)
    qsl = torch.tensor([0, 7, 25], dtype=torch.int32, device=DEVICE)
    out = extend_attention(q, pool.k, pool.v, pool.block_table, qsl, pool.seq_lens, 18, block_m=16, block_n=16)
    assert_close(out, reference_extend(pool, q, q_lens), dtype)


@pytest.mark.parametrize("splits", [2, 4])
@pytest.mark.parametrize("block_size", [1, 16])
def test_a_short_chunk_after_a_long_prefix_splits_the_prefix(splits, block_size):
    """The prefix's keys in splits, each with every query block of its sequence, merged by log-sum-exp; a prefix
    too short to split runs whole, and a sequence without one too."""
    q_lens = [5, 1, 12, 3, 7]
    lengths = [60, 41, 70, 9, 7]  # prefixes 55, 40, 58, 6 (shorter than a split) and 0
    pool = Pool(lengths, block_size, num_kv_heads=3, head_dim=64, seed=splits)
    q = torch.randn(sum(q_lens), 9, 64, device=DEVICE)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    out = poisoned(q.shape, q.dtype)
    extend_attention(q, pool.k, pool.v, pool.block_table, qsl, pool.seq_lens, max(q_lens), out=out, block_m=16,
                     block_n=16, splits=splits, min_split_len=16)
    assert_close(out, reference_extend(pool, q, q_lens), torch.float32)


def test_rows_no_sequence_owns_merge_nothing():
    """A CUDA graph's extend step is captured before any chunk is in its buffers: its rows belong to no sequence
    (query_start_loc [0, 0]). Nothing may be read for them beyond the merge slots (on the H200 an uninitialised
    split count read past them and faulted), and the real rows of a later launch are unaffected."""
    pool = Pool([40], 16, num_kv_heads=3, head_dim=64, seed=1)
    q = torch.randn(8, 9, 64, device=DEVICE)
    empty = torch.tensor([0, 0], dtype=torch.int32, device=DEVICE)
    extend_attention(q, pool.k, pool.v, pool.block_table, empty, pool.seq_lens, 8, block_m=16, block_n=16, splits=3,
                     min_split_len=16)
    qsl = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    out = extend_attention(q, pool.k, pool.v, pool.block_table, qsl, pool.seq_lens, 8, block_m=16, block_n=16,
                           splits=3, min_split_len=16)
    assert_close(out, reference_extend(pool, q, [8]), torch.float32)


def test_the_extend_split_rule():
    """The write-up's warm request (38 tokens after 2,080, SmolLM2's 9 heads): one query block per head, far fewer
    programs than 4 per SM, so the prefix is split; long chunks fill the GPU with query blocks and are not."""
    assert extend_splits(1, 38, 2080, 9, 64, 132) == 9  # a split per 256 prefix tokens (59 would fill the GPU)
    assert extend_splits(1, 38, 8192, 9, 64, 132) == 16  # at most MAX_SPLITS
    assert extend_splits(4, 2048, 4096, 32, 128, 132) == 1
    assert extend_splits(1, 38, 300, 9, 64, 132) == 1  # a prefix shorter than two splits


# ---- a property over random block tables and lengths ----------------------------------------------------
@st.composite
def batches(draw):
    n = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    q_lens = [draw(st.integers(1, length)) for length in lengths]
    return dict(lengths=lengths, q_lens=q_lens, block_size=draw(st.sampled_from([1, 2, 4, 16])),
                group=draw(st.sampled_from([1, 3])), splits=draw(st.integers(1, 4)), seed=draw(st.integers(0, 99)))


@pytest.mark.task("task6.address")
@pytest.mark.task("task6.online_softmax")
@pytest.mark.task("task6.causal")
@pytest.mark.task("task6.merge")
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
@example(dict(lengths=[40, 3], q_lens=[7, 3], block_size=4, group=3, splits=4, seed=0))  # splits: the merge runs
def test_decode_and_extend_on_random_block_tables(case):
    pool = Pool(case["lengths"], case["block_size"], num_kv_heads=1, head_dim=64, seed=case["seed"])
    g = case["group"]
    q = torch.randn(len(case["lengths"]), g, 64, device=DEVICE)
    out = paged_decode_attention(q, pool.k, pool.v, pool.block_table, pool.seq_lens, case["splits"], **SPLIT_ALL)
    assert_close(out, reference_decode(pool, q), torch.float32)
    q_lens = case["q_lens"]
    qx = torch.randn(sum(q_lens), g, 64, device=DEVICE)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    out = extend_attention(qx, pool.k, pool.v, pool.block_table, qsl, pool.seq_lens, max(q_lens), block_m=16,
                           block_n=16)
    assert_close(out, reference_extend(pool, qx, q_lens), torch.float32)


def test_split_buckets_cover_every_context_with_at_most_four_times_its_splits():
    """A CUDA-graph runner captures decode steps on split axes 1, 4, 16 ... up to the longest context's; the axis
    a step replays holds every split the launch rule gives its longest context, and is less than four times it."""
    assert split_buckets(512) == [1]
    assert split_buckets(8192) == [1, 4, 16]
    assert split_buckets(4096) == [1, 4, 8]
    assert split_buckets(131072) == [1, 4, 16, 64]
    for top in (512, 4096, 8192, 131072):
        buckets = split_buckets(top)
        for context in range(1, top + 1, 97):
            need = num_kv_splits(context)
            axis = split_bucket(buckets, context)
            assert axis in buckets and need <= axis < 4 * need
    assert split_bucket(split_buckets(8192), MIN_SPLIT_LEN) == 1


def test_a_launch_of_one_split_runs_no_merge(monkeypatch):
    """On the one-split axis (what a graph of short contexts replays) every sequence writes its output itself: the
    merge kernel is not launched, one kernel fewer per layer."""
    from step06_triton import decode_attention
    pool = Pool([5, 40, 300], 16, num_kv_heads=2, head_dim=64, seed=4)
    q = torch.randn(3, 4, 64, device=DEVICE)
    want = reference_decode(pool, q)

    def no_merge(*args):
        raise AssertionError("a one-split launch ran the merge")
    monkeypatch.setattr(decode_attention, "merge_partials", no_merge)
    out = decode_attention.paged_decode_attention(q, pool.k, pool.v, pool.block_table, pool.seq_lens, 1,
                                                  out=poisoned(q.shape, q.dtype))
    assert_close(out, want, torch.float32)


def test_flashinfer_page_lists_are_the_block_tables_pages():
    """The FlashInfer anchor hands FlashInfer the course's block tables as its page lists: each sequence's pages
    in order, its last page's token count, and nothing of the table's padding."""
    from benchmarks.step06.flashinfer_anchor import page_lists

    table = torch.tensor([[7, 2, 9, 0], [4, 0, 0, 0], [1, 3, 5, 6]], dtype=torch.int32)
    indptr, indices, last = page_lists(table, [33, 16, 49], block_size=16)
    assert indptr.tolist() == [0, 3, 4, 8]
    assert indices.tolist() == [7, 2, 9, 4, 1, 3, 5, 6]
    assert last.tolist() == [1, 16, 1]
    assert {t.dtype for t in (indptr, indices, last)} == {torch.int32}
