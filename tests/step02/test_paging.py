"""Slot mapping, store, gather and paged attention against plain Python loops (the mini-vllm tutorial's
unoptimized code) and contiguous attention. Paged attention is graded on metadata built here by those loops, so it
needs no slot-mapping homework."""
from __future__ import annotations

import pytest
import torch

from step01_kvcache.attention import attention, causal_mask
from step01_kvcache.request import SamplingParams
from step01_kvcache.tiny import tiny_config
from step02_paged.block_table import BlockTable
from step02_paged.forward_batch import ForwardBatch
from step02_paged.geometry import PoolGeometry
from step02_paged.kv_pool import KVPool
from step02_paged.paged_attention import AttentionMetadata, PagedAttention, PrefillSpan
from step02_paged.sequence import Sequence
from step02_paged.slot_mapping import block_table_tensor, context_slots, slot_mapping

TABLES = [[3, 0, 5], [1], [4, 2]]


def naive_slot(table: list[int], pos: int, bs: int) -> int:
    return table[pos // bs] * bs + pos % bs


@pytest.mark.task("task2.slot_mapping")
@pytest.mark.parametrize("bs", [1, 4, 16])
def test_slot_mapping_matches_page_table_lookup(bs):
    tables = TABLES
    lens = [len(t) * bs for t in tables]
    seq_index, positions, expected = [], [], []
    for i, (t, n) in enumerate(zip(tables, lens)):
        for p in range(n):
            seq_index.append(i)
            positions.append(p)
            expected.append(naive_slot(t, p, bs))
    got = slot_mapping(block_table_tensor(tables), torch.tensor(seq_index), torch.tensor(positions), bs)
    assert got.tolist() == expected


@pytest.mark.task("task2.slot_mapping")
def test_context_slots_rows():
    bt = block_table_tensor(TABLES)
    got = context_slots(bt, 6, 2)
    assert got[0].tolist() == [6, 7, 0, 1, 10, 11]
    assert got[2, :4].tolist() == [8, 9, 4, 5]


@pytest.mark.task("task2.paged_attention")
def test_store_then_gather_roundtrip():
    cfg = tiny_config()
    pool = KVPool(cfg, PoolGeometry(6, 4))
    slots = torch.tensor([22, 3, 9, 0])
    k = torch.randn(4, cfg.num_kv_heads, cfg.head_dim)
    v = torch.randn(4, cfg.num_kv_heads, cfg.head_dim)
    pool.store(1, slots, k, v)
    for i, s in enumerate(slots.tolist()):  # the naive address: block s // 4, offset s % 4
        assert torch.equal(pool.k[1, s // 4, s % 4], k[i]) and torch.equal(pool.v[1, s // 4, s % 4], v[i])
    assert pool.k[0].abs().sum() == 0, "another layer was written"
    gk, gv = pool.gather(1, torch.tensor([[0, 9], [3, 22]]))
    assert gk.shape == (2, 2, cfg.num_kv_heads, cfg.head_dim)
    assert torch.equal(gk[0, 0], k[3]) and torch.equal(gk[1, 1], k[0]) and torch.equal(gv[0, 1], v[2])


def test_pool_shape_and_bad_sizes():
    cfg = tiny_config()
    pool = KVPool(cfg, PoolGeometry(3, 4))
    assert pool.k.shape == (cfg.num_layers, 3, 4, cfg.num_kv_heads, cfg.head_dim)
    assert pool.bytes_per_block == 2 * cfg.num_layers * 4 * cfg.num_kv_heads * cfg.head_dim * 4
    with pytest.raises(ValueError):
        KVPool(cfg, PoolGeometry(3, 0))


@pytest.mark.task("task2.slot_mapping")
def test_step_metadata_positions_and_slots_match_a_loop():
    """Two decodes, then a prefill chunk after 3 cached tokens and a fresh prompt: every row's position and slot."""
    tables, computed, new, bs = [[3, 0], [1], [4, 2], [5]], [5, 2, 3, 0], [1, 1, 4, 2], 4
    batch = ForwardBatch.from_block_tables(tables, computed, new, bs)
    md = AttentionMetadata.build(batch)
    positions = [p for c, t in zip(computed, new) for p in range(c, c + t)]
    rows = [i for i, t in enumerate(new) for _ in range(t)]
    assert batch.positions.tolist() == positions
    assert md.slot_mapping.tolist() == [naive_slot(tables[i], p, bs) for i, p in zip(rows, positions)]
    assert md.num_decodes == 2 and [(s.start, s.end) for s in md.prefills] == [(2, 6), (6, 8)]
    assert md.prefills[0].slots.tolist() == [naive_slot(tables[2], p, bs) for p in range(7)]


@pytest.mark.task("task2.paged_attention")
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (8, 1)])
def test_paged_attention_equals_contiguous_attention(heads, kv_heads):
    """Two decodes of different contexts, a prefill chunk after 2 cached tokens and a fresh prompt, with metadata
    built here by the naive page-table lookup: the step's K/V land in the pool, and each sequence attends over
    exactly its own context (chapter 1's attention over contiguous K/V is the reference)."""
    cfg = tiny_config(num_heads=heads, num_kv_heads=kv_heads)
    bs, tables, computed, new = 2, [[4, 1], [0, 5, 3], [6, 2, 7], [8]], [2, 4, 2, 0], [1, 1, 3, 2]
    pool = KVPool(cfg, PoolGeometry(9, bs))
    hkv, d = cfg.num_kv_heads, cfg.head_dim
    gen = torch.Generator().manual_seed(0)
    cached = [(torch.randn(c, hkv, d, generator=gen), torch.randn(c, hkv, d, generator=gen)) for c in computed]
    for table, (ck, cv) in zip(tables, cached):  # the earlier steps' K/V, written at their naive addresses
        for p, (kk, vv) in enumerate(zip(ck, cv)):
            pool.k[1, table[p // bs], p % bs], pool.v[1, table[p // bs], p % bs] = kk, vv
    rows = [(i, p) for i, (c, n) in enumerate(zip(computed, new)) for p in range(c, c + n)]
    width = max(c + n for c, n in zip(computed[:2], new[:2]))
    md = AttentionMetadata(
        slot_mapping=torch.tensor([naive_slot(tables[i], p, bs) for i, p in rows]), num_decodes=2,
        decode_slots=torch.tensor([[naive_slot(tables[i], min(p, c), bs) for p in range(width)]
                                   for i, c in enumerate(computed[:2])]),
        decode_mask=torch.tensor([[[p > c for p in range(width)]] for c in computed[:2]]),
        prefills=tuple(PrefillSpan(start, start + new[i], torch.tensor([naive_slot(tables[i], p, bs)
                                                                        for p in range(computed[i] + new[i])]),
                                   torch.tensor([[p > computed[i] + r for p in range(computed[i] + new[i])]
                                                 for r in range(new[i])]))
                       for i, start in [(2, 2), (3, 5)]))
    T = len(rows)
    q, k, v = torch.randn(T, cfg.num_heads, d), torch.randn(T, hkv, d), torch.randn(T, hkv, d)
    out = PagedAttention(pool, md).attend(1, q, k, v)
    expected, start = [], 0
    for i, (c, n) in enumerate(zip(computed, new)):
        keys, values = torch.cat([cached[i][0], k[start: start + n]]), torch.cat([cached[i][1], v[start: start + n]])
        expected.append(attention(q[start: start + n], keys, values, causal_mask(torch.arange(c, c + n), c + n)))
        start += n
    torch.testing.assert_close(out, torch.cat(expected))
    for (i, p), kk in zip(rows, k):
        assert torch.equal(pool.k[1, tables[i][p // bs], p % bs], kk), f"row of sequence {i}, position {p}"
    assert pool.k[0].abs().sum() == 0, "another layer was written"


@pytest.mark.task("task2.slot_mapping")
def test_forward_batch_from_persistent_rows_matches_a_loop():
    """The engine's batch: rows of a persistent block table, kept in step by appends only; every token's id,
    position and slot, each sequence's context and first row, as a per-token loop computes them."""
    bs, table = 4, BlockTable(max_rows=4, max_blocks=8)
    seqs = [Sequence(i, list(range(10 * i, 10 * i + n)), SamplingParams()) for i, n in enumerate([6, 3, 9])]
    for seq, blocks in zip(seqs, [[3, 0], [1], [4, 2, 7]]):
        seq.block_table = blocks
    seqs[0].advance(5)  # a decode: its sixth token
    seqs[2].advance(3)  # a chunk of 6 after 3 cached tokens
    new = [1, 3, 6]
    batch = ForwardBatch.build(seqs, new, table, bs, sample_rows=[0, 2])
    positions = [p for s, n in zip(seqs, new) for p in range(s.num_computed_tokens, s.num_computed_tokens + n)]
    owners = [s for s, n in zip(seqs, new) for _ in range(n)]
    assert batch.input_ids.tolist() == [s.all_token_ids[p] for s, p in zip(owners, positions)]
    assert batch.positions.tolist() == positions
    assert batch.slot_mapping.tolist() == [naive_slot(s.block_table, p, bs) for s, p in zip(owners, positions)]
    assert batch.seq_lens.tolist() == [6, 3, 9] and batch.query_start_loc.tolist() == [0, 1, 4, 10]
    assert batch.logits_indices.tolist() == [0, 9] and batch.num_decodes == 1
    assert batch.block_tables()[:, :3].tolist() == [[3, 0, 0], [1, 0, 0], [4, 2, 7]]
    seqs[1].block_table.append(5)  # the next step adds a block: only it is written to the row
    ForwardBatch.build(seqs[1:2], [1], table, bs, sample_rows=[0])
    assert table.cpu[table.rows[1], :2].tolist() == [1, 5] and seqs[1].synced_blocks == 2
