"""Each kernel against the torch path it replaces (chapter 2's slots, chapter 1's `attention` over the gathered
K/V): partial last blocks, blocks of 1 and 16, contexts of one token and of many blocks, the decode launch
rule's edge cases (the plan on the device against the host's), GQA groups 1, 3 (SmolLM2), 4 and 8, head_dim
64 and 128, slot -1; fp32 and fp16. On a CPU the kernels run through Triton's interpreter (conftest.py turns it
on; shapes stay tiny); on a GPU the same tests run compiled."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from step01_kvcache.attention import attention
from step06_triton.decode_attention import (
    FILL_PER_SM,
    MAX_SPLITS,
    MIN_SPLIT_LEN,
    PROGRAMS_PER_SM,
    num_kv_splits,
    paged_decode_attention,
    split_bucket,
    split_buckets,
    split_plan,
    split_plan_host,
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


@pytest.mark.task("task6.address")
@pytest.mark.task("task6.online_softmax")
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


@pytest.mark.task("task6.merge")
@pytest.mark.parametrize("lengths,max_splits", [([1, 300], 16), ([20, 3], 8), ([5, 3, 1], 8), ([300], 3)])
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
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
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
