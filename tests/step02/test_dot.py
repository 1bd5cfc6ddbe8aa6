"""The chapter's pictures (pictures.py): `block_tables_dot(kv)` (block tables -> pool blocks) and `occupancy_map(kv)`.

Both are plain text built without graphviz, so they can be compared as strings: the same state must give
the same text, every pool block must appear with its reference count, and every block-table cell must
point at its block.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from course import draw
from step01_kvcache.generate import SamplingParams
from step01_kvcache.tiny import tiny_model
from step02_paged import Engine, EngineConfig, KVCacheManager, PrefixMatch, Sequence
from step02_paged.geometry import PoolGeometry
from step02_paged.pictures import block_tables_dot, occupancy_map

MODEL = tiny_model(seed=3, num_layers=1, hidden_size=32, intermediate_size=32, head_dim=8)
PROMPT_LENS = (3, 9, 14)

NODE = re.compile(r'^\s*"blk(\d+)" \[(.*)\];$', re.M)
EDGE = re.compile(r'^\s*"seq(\d+)":b(\d+) -> "blk(\d+)";$', re.M)


def engine_after(steps: int) -> Engine:
    """Three ragged requests on a 16-block pool, driven `steps` engine steps."""
    engine = Engine(MODEL, EngineConfig(num_blocks=16, block_size=4, max_num_seqs=3, max_num_batched_tokens=12))
    for n in PROMPT_LENS:
        engine.add_request([(7 * i + n) % 256 for i in range(n)], SamplingParams(max_new_tokens=5))
    for _ in range(steps):
        engine.step()
    return engine


def block_nodes(dot: str) -> dict[int, str]:
    """Block id -> the attribute text of its node line."""
    nodes: dict[int, str] = {}
    for m in NODE.finditer(dot):
        assert int(m[1]) not in nodes, f"block {m[1]} drawn twice"
        nodes[int(m[1])] = m[2]
    return nodes


def edges(dot: str) -> list[tuple[int, int, int]]:
    """(seq_id, table cell, block id) of every block-table edge."""
    return [(int(s), int(i), int(b)) for s, i, b in EDGE.findall(dot)]


def fill(attrs: str) -> str:
    return re.search(r'fillcolor="([^"]+)"', attrs)[1]


def shared_setup() -> tuple[KVCacheManager, Sequence, Sequence]:
    """Two sequences by hand: seq 1 shares seq 0's first block (as a prefix cache would arrange)."""
    kv = KVCacheManager(PoolGeometry(6, 4))
    a = Sequence(0, list(range(8)), SamplingParams())
    assert kv.allocate_slots(a, 8)
    a.advance(8)
    b = Sequence(1, list(range(4)) + [50, 51], SamplingParams())
    assert kv.allocate_slots(b, 2, PrefixMatch(tuple(a.block_table[:1]), 4))
    b.admit(4)
    b.advance(2)
    kv.check_invariants()
    return kv, a, b


def test_to_dot_is_deterministic():
    first, second = engine_after(3), engine_after(3)
    assert block_tables_dot(first.cache_manager) == block_tables_dot(second.cache_manager)
    assert block_tables_dot(first.cache_manager) == block_tables_dot(first.cache_manager), "drawing changed the state"
    # the order in which sequences became holders is not part of the state
    text = block_tables_dot(first.cache_manager)
    first.cache_manager.holders = dict(reversed(list(first.cache_manager.holders.items())))
    assert block_tables_dot(first.cache_manager) == text
    assert block_tables_dot(engine_after(4).cache_manager) != text, "the picture did not change with the state"


@pytest.mark.parametrize("steps", [0, 1, 3, 6])
def test_every_block_is_drawn_with_its_ref_count(steps):
    kv = engine_after(steps).cache_manager
    nodes = block_nodes(block_tables_dot(kv))
    assert sorted(nodes) == list(range(kv.num_blocks)), "every pool block, free or not, is one node"
    bm = kv.block_manager
    for b, attrs in nodes.items():
        assert f"block {b}" in attrs and f"ref {bm.ref_count[b]}" in attrs, attrs
    free = set(bm.free_blocks)
    grey = {fill(nodes[b]) for b in free}
    assert len(grey) <= 1, "free blocks are drawn in one colour"
    assert not grey & {fill(nodes[b]) for b in nodes if b not in free}, "a held block is drawn like a free one"


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_each_table_cell_points_at_its_block(steps):
    kv = engine_after(steps).cache_manager
    dot = block_tables_dot(kv)
    expected = sorted((s.seq_id, i, b) for s in kv.holders.values() for i, b in enumerate(s.block_table))
    assert expected, "the setup should have sequences holding blocks"
    assert sorted(edges(dot)) == expected
    for seq in kv.holders.values():
        for i, b in enumerate(seq.block_table):
            assert f"<b{i}> {b}" in dot, f"seq {seq.seq_id}: table cell {i} (block {b}) missing from its record"
    assert not {b for _, _, b in edges(dot)} & set(kv.block_manager.free_blocks), "an edge into a free block"


def test_shared_block_has_two_edges_and_ref_count_two():
    kv, a, b = shared_setup()
    shared = a.block_table[0]
    assert b.block_table[0] == shared and kv.block_manager.ref_count[shared] == 2
    dot = block_tables_dot(kv)
    assert (0, 0, shared) in edges(dot) and (1, 0, shared) in edges(dot)
    nodes = block_nodes(dot)
    assert "ref 2" in nodes[shared]
    single = a.block_table[1]
    assert "ref 1" in nodes[single] and fill(nodes[shared]) != fill(nodes[single]), "shared blocks stand out"
    occ = occupancy_map(kv)
    assert occ[shared] == "*" and occ[single] == "0" and occ[b.block_table[1]] == "1"

    kv.free(b)  # the last holder but one lets go: the block stays, its count drops
    kv.check_invariants()
    nodes = block_nodes(block_tables_dot(kv))
    assert "ref 1" in nodes[shared] and occupancy_map(kv)[shared] == "0"


def test_to_dot_needs_no_dot_binary(monkeypatch):
    reference = block_tables_dot(engine_after(2).cache_manager)

    def refuse(*args, **kwargs):
        raise AssertionError("to_dot must not run a subprocess")

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(subprocess, "run", refuse)
    kv = engine_after(2).cache_manager
    assert block_tables_dot(kv) == reference
    assert draw.render_svg(reference) is None
    shown = draw.show(reference)  # the notebook fallback: the DOT text itself
    assert reference in shown.data


@pytest.mark.skipif(not draw.has_dot(), reason="graphviz `dot` not installed")
def test_dot_source_is_valid_graphviz():
    kv, _, _ = shared_setup()
    for manager in (engine_after(3).cache_manager, kv, engine_after(0).cache_manager):
        source = block_tables_dot(manager)
        assert "<svg" in draw.render_svg(source)


@pytest.mark.parametrize("steps", [0, 1, 3, 5])
def test_occupancy_map_has_one_char_per_block(steps):
    kv = engine_after(steps).cache_manager
    occ = occupancy_map(kv)
    assert len(occ) == kv.num_blocks
    free = set(kv.block_manager.free_blocks)
    assert {i for i, c in enumerate(occ) if c == "."} == free
    for seq in kv.holders.values():
        for b in seq.block_table:
            assert occ[b] == str(seq.seq_id), f"block {b} of seq {seq.seq_id} shows {occ[b]!r}"


def test_drained_engine_draws_an_empty_pool():
    engine = engine_after(0)
    while engine.has_unfinished():
        engine.step()
    kv = engine.cache_manager
    assert occupancy_map(kv) == "." * kv.num_blocks
    dot = block_tables_dot(kv)
    assert edges(dot) == [] and all("ref 0" in attrs for attrs in block_nodes(dot).values())
