"""Slot mapping, store, gather and paged attention against plain Python loops (the mini-vllm tutorial's
unoptimized code) and contiguous attention."""
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
from step02_paged.paged_attention import AttentionMetadata, PagedAttention
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
def test_paged_attention_equals_contiguous_attention():
    """Per layer: the step's K/V land in the pool, and each sequence attends over exactly its own context."""
    cfg = tiny_config()
    bs, tables, computed, new = 2, [[4, 1], [0, 5, 3], [2]], [2, 0, 0], [1, 5, 2]
    pool = KVPool(cfg, PoolGeometry(6, bs))
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    cached_k, cached_v = torch.randn(2, hkv, d), torch.randn(2, hkv, d)  # sequence 0's first two tokens
    pool.store(1, torch.tensor([naive_slot(tables[0], p, bs) for p in range(2)]), cached_k, cached_v)
    q, k, v = torch.randn(8, hq, d), torch.randn(8, hkv, d), torch.randn(8, hkv, d)
    out = PagedAttention.for_step(pool, ForwardBatch.from_block_tables(tables, computed, new, bs)).attend(1, q, k, v)
    decode = attention(q[:1], torch.cat([cached_k, k[:1]]), torch.cat([cached_v, v[:1]]), None)
    first = attention(q[1:6], k[1:6], v[1:6], causal_mask(torch.arange(5), 5))
    second = attention(q[6:], k[6:], v[6:], causal_mask(torch.arange(2), 2))
    torch.testing.assert_close(out, torch.cat([decode, first, second]))
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
