"""Cascade attention (cascade.py) against plain paged decode and against the torch reference: groups of many rows
and of one, rows in no group, two groups at once, prefixes that end inside a block, ragged suffixes, GQA 9/3 and
32/8, blocks of 1 and 16; fp32 (relative error ≤ 1e-6) and fp16. The engine with cascade gives the tokens of the
engine without, on every design. On a CPU the kernels run through Triton's interpreter: shapes stay tiny."""
from __future__ import annotations

import pytest
import torch

from step01_kvcache.request import SamplingParams
from step01_kvcache.tiny import tiny_model
from step06_triton.cascade import CascadeGroup, CascadeMetadata, cascade_decode_attention, cascade_reference
from step06_triton.decode_attention import paged_decode_attention
from step06_triton.engine import make_engine
from tests.driver import drive_to_end

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class SharedPool:
    """One layer of a paged pool whose first rows' block tables start with the same blocks (a cached prefix)."""

    def __init__(self, lengths: list[int], shared_blocks: dict[tuple[int, ...], int], block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        need = [-(-n // block_size) for n in lengths]
        num_blocks = sum(need) + 3
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.randn(shape, generator=g).to(DEVICE, dtype)
        self.v = torch.randn(shape, generator=g).to(DEVICE, dtype)
        free = torch.randperm(num_blocks, generator=g).tolist()
        self.tables = [[] for _ in lengths]
        for rows, n in shared_blocks.items():  # the rows' tables start with the same n blocks
            head = [free.pop() for _ in range(n)]
            for r in rows:
                self.tables[r] = list(head)
        for r, n in enumerate(need):
            self.tables[r] += [free.pop() for _ in range(n - len(self.tables[r]))]
        width = max(need)
        self.block_table = torch.tensor([t + [0] * (width - len(t)) for t in self.tables], dtype=torch.int32,
                                        device=DEVICE)
        self.lengths, self.block_size = lengths, block_size

    def context(self, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(self.lengths[r])
        slots = (torch.tensor(self.tables[r])[pos // self.block_size] * self.block_size + pos % self.block_size)
        flat = lambda t: t.view(-1, t.shape[-2], t.shape[-1])  # noqa: E731
        return flat(self.k)[slots.to(DEVICE)], flat(self.v)[slots.to(DEVICE)]


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "a row was left unwritten (NaN) or overflowed"
    return float((out.double() - ref.double()).norm() / ref.double().norm())


CASES = {  # lengths (context incl. the new token), block size, shared blocks, groups (rows, prefix tokens)
    "one group of many, mid-block prefix": ([23, 30, 18, 41], 4, {(0, 1, 2, 3): 4}, [((0, 1, 2, 3), 14)]),
    "two groups and a loner": ([20, 33, 21, 9, 26, 40], 4, {(0, 2, 4): 3, (1, 5): 5},
                               [((0, 2, 4), 12), ((1, 5), 20)]),
    "a group of one": ([17, 25], 16, {(0,): 1}, [((0,), 16)]),
    "blocks of one token": ([12, 19, 15], 1, {(0, 1, 2): 10}, [((0, 1, 2), 10)]),
}


@pytest.mark.parametrize("case,heads", [(case, (9, 3, 64)) for case in sorted(CASES)]
                         + [("two groups and a loner", (32, 8, 64))], ids=lambda x: x if isinstance(x, str) else
                         f"{x[0]}/{x[1]}")
def test_cascade_is_plain_decode(case, heads):
    lengths, block_size, shared, groups = CASES[case]
    num_heads, num_kv_heads, head_dim = heads
    pool = SharedPool(lengths, shared, block_size, num_kv_heads, head_dim, seed=len(case))
    q = torch.randn(len(lengths), num_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    groups = [CascadeGroup(rows, n) for rows, n in groups]
    md = CascadeMetadata.build(groups, lengths, num_heads, num_kv_heads, head_dim, DEVICE)
    out = cascade_decode_attention(q, pool.k, pool.v, pool.block_table, md,
                                   out=torch.full_like(q, float("nan")))  # poisoned: every row must be written
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    plain = paged_decode_attention(q, pool.k, pool.v, pool.block_table, seq_lens, 4)
    ref = cascade_reference(q, [pool.context(r) for r in range(len(lengths))], groups)
    assert relative_error(out, ref) <= 1e-6 and relative_error(out, plain) <= 1e-6


def test_cascade_in_half_precision():
    lengths = [40, 37, 45, 8]
    pool = SharedPool(lengths, {(0, 1, 2): 2}, 16, 3, 64, dtype=torch.float16, seed=5)
    q = torch.randn(4, 9, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE, torch.float16)
    groups = [CascadeGroup((0, 1, 2), 29)]
    md = CascadeMetadata.build(groups, lengths, 9, 3, 64, DEVICE)
    out = cascade_decode_attention(q, pool.k, pool.v, pool.block_table, md)
    ref = cascade_reference(q, [pool.context(r) for r in range(4)], groups)
    assert relative_error(out, ref) < 2e-3


def test_the_prefix_is_split_and_the_slots_follow_it():
    """A long prefix and few queries: the prefix pass cuts its keys into splits (whole tiles, none empty), and
    each member's own splits start at the slot after its group's."""
    md = CascadeMetadata.build([CascadeGroup((0, 2), 4000)], [4100, 900, 4010], 9, 3, 64, "cpu", num_sms=132)
    splits, length = md.group_splits.tolist(), md.group_split_len.tolist()
    assert splits[0] > 1 and length[0] % md.block_n == 0 and (splits[0] - 1) * length[0] < 4000 <= splits[0] * length[0]
    assert md.kv_start.tolist() == [4000, 0, 4000] and md.slot_base.tolist() == [splits[0], 0, splits[0]]
    assert md.suffix_lens.tolist() == [100, 900, 10] and md.num_tiles.tolist() == [1]


@pytest.mark.parametrize("groups,match", [
    ([CascadeGroup((0, 1), 30)], "shorter than each row's context"),
    ([CascadeGroup((0, 1), 5), CascadeGroup((1, 2), 5)], "at most one cascade group"),
    ([CascadeGroup((0, 7), 5)], "at most one cascade group"),
])
def test_bad_groups_are_refused(groups, match):
    with pytest.raises(ValueError, match=match):
        CascadeMetadata.build(groups, [30, 40, 50], 9, 3, 64, "cpu")


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3, num_layers=1, hidden_size=32, intermediate_size=32, num_heads=6, num_kv_heads=2,
                      head_dim=16).to(DEVICE)


@pytest.mark.parametrize("design,block_size,overlap", [("hash", 4, False), ("radix", 1, True), ("bridge", 4, False)])
def test_the_engine_gives_the_same_tokens_with_cascade(model, design, block_size, overlap):
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, 200, (n,), generator=g).tolist()  # noqa: E731
    systems = [ids(24)] if design == "hash" else [ids(24), ids(21)]  # ref counts see one prompt common to all
    prompts = [systems[i % len(systems)] + ids(1 + i % 3) for i in range(4)]
    params = SamplingParams(max_new_tokens=3)
    outs = {}
    for cascade in (False, True):
        engine = make_engine(model, design, "triton", overlap=overlap, cascade=cascade, cascade_min_tokens=8,
                             cascade_min_seqs=2, num_blocks=256 // block_size, block_size=block_size, max_num_seqs=4)
        drive_to_end(engine, prompts[:len(systems)], params)  # the system prompts are cached
        groups = count_groups(engine) if cascade else []
        outs[cascade] = [o.output_ids for o in drive_to_end(engine, prompts, params)]
    assert outs[True] == outs[False]
    assert sum(n > 0 for n in groups) >= 2, "decode steps were meant to read a shared prefix once"


def count_groups(engine) -> list[int]:
    """Wrap the engine's `_prepare`: the list returned gets the number of cascade groups of every step."""
    seen, prepare = [], engine._prepare

    def counted(batch, token_ids=None):
        forward_batch, sampled = prepare(batch, token_ids)
        seen.append(len(forward_batch.cascade))
        return forward_batch, sampled

    engine._prepare = counted
    return seen


def test_cascade_needs_the_triton_kernels(model):
    with pytest.raises(ValueError, match="Triton"):
        make_engine(model, "bridge", "torch", cascade=True)
    with pytest.raises(ValueError, match="cascade_min_seqs"):
        make_engine(model, "bridge", "triton", cascade=True, cascade_min_seqs=0)
