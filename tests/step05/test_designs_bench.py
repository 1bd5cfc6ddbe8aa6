"""The model-free designs bench on `diverge` (a shared prefix that ends 7 tokens into a 16-token block): every design
reuses the same tokens and holds the same blocks at each block size, and the offset tree's matches' offsets add up to
the shared part-block each warm request computes again (timings themselves are not tested)."""
from benchmarks.step05.bench import compare
from course.workloads import DIVERGE_SHARED_PREFIX, get_workload


def test_designs_hold_the_same_blocks_and_the_offsets_count_the_recomputed_part_block(tokenizer):
    [row] = compare(["diverge"], [16, 4], repeats=1)
    warm = len(get_workload("diverge").prompts(tokenizer)) - 1
    for bs in (16, 4):
        hashed, bridge, offset = (row[f"{d} bs={bs}"] for d in ("hash", "bridge", "offset"))
        assert hashed["cached_tokens"] == bridge["cached_tokens"] == offset["cached_tokens"] \
            == warm * (DIVERGE_SHARED_PREFIX // bs * bs)
        assert hashed["cached_blocks"] == bridge["cached_blocks"] == offset["cached_blocks"]
        assert offset["offset_tokens"] == warm * (DIVERGE_SHARED_PREFIX % bs)
        assert "offset_tokens" not in bridge and all(d["bookkeeping_us"] > 0 for d in (hashed, bridge, offset))
    assert row["radix (ch. 4)"]["cached_tokens"] == warm * DIVERGE_SHARED_PREFIX
