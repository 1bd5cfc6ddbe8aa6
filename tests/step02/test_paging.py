"""Slot mapping, store and gather against plain Python loops (the mini-vllm tutorial's unoptimized code)."""
from __future__ import annotations

import pytest
import torch

from course.tiny import tiny_config
from step02_paged.kv_pool import KVPool
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


@pytest.mark.task("task2.store_gather")
def test_store_then_gather_roundtrip():
    cfg = tiny_config()
    pool = KVPool(cfg, num_blocks=6, block_size=4)
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
    pool = KVPool(cfg, 3, 4)
    assert pool.k.shape == (cfg.num_layers, 3, 4, cfg.num_kv_heads, cfg.head_dim)
    assert pool.bytes_per_block == 2 * cfg.num_layers * 4 * cfg.num_kv_heads * cfg.head_dim * 4
    with pytest.raises(ValueError):
        KVPool(cfg, 3, 0)
