"""The mini-runtime textbook's block radix tree alone: splits fall on block boundaries, the branches cut inside a
block carry the offset of their dead slots, matches return whole blocks plus the offset, and every offset follows
the siblings it was measured against (a split, a new branch, an eviction)."""
from __future__ import annotations

import pytest

from step05_bridge.offset_tree import OffsetRadixTree, branch_offset

BS = 16
FIRST = list(range(10, 58))  # the textbook's first prompt: 48 tokens, blocks 100, 101, 102
SECOND = FIRST[:20] + list(range(90, 102))  # shares its first 20 tokens: 32 tokens, blocks 100 and 200


def children_by_offset(tree: OffsetRadixTree, node) -> dict[int, tuple[list[int], int]]:
    """node's children as {first token of the branch's own part: (blocks, offset)}."""
    return {c.key[0][c.offset]: (c.value, c.offset) for c in node.children.values()}


def test_the_textbook_split():
    tree = OffsetRadixTree(BS)
    assert tree.insert(FIRST, [100, 101, 102]) == 0
    blocks, node, offset = tree.match(SECOND)
    assert (blocks, tree.depth(node), offset) == ([100], 16, 4), "20 common tokens: 16 reused, 4 recomputed"
    assert tree.insert(SECOND, [100, 200]) == 16
    upper = tree.root.children[tuple(FIRST[:16])]
    assert (upper.value, upper.offset, tree.depth(upper)) == ([100], 0, 16), "the upper node: whole blocks only"
    assert children_by_offset(tree, upper) == {FIRST[20]: ([101, 102], 4), SECOND[20]: ([200], 4)}, \
        "the first prompt's branch keeps 101 and 102, its own tokens from slot 4; the second's, 200, from token 16"
    tree.check_invariants()


def test_a_repeated_prompt_finds_its_branch_again():
    """The cut branch still spells its dead slots' tokens: the first prompt again reuses every block."""
    tree = OffsetRadixTree(BS)
    tree.insert(FIRST, [100, 101, 102])
    tree.insert(SECOND, [100, 200])
    assert tree.match(FIRST + [7]) == ([100, 101, 102], tree.match(FIRST)[1], 0)
    assert tree.match(FIRST[:40])[0] == [100, 101], "a partial block is never returned"
    tree.check_invariants()


def test_offsets_follow_the_siblings():
    """A third branch parting after 18 tokens: offsets are the most any sibling shares; evicting the branch that
    set an offset lowers it again."""
    tree = OffsetRadixTree(BS)
    tree.insert(FIRST, [100, 101, 102])
    third = FIRST[:18] + [5] * 14
    tree.insert(third, [100, 300])
    tree.insert(SECOND, [100, 200])
    upper = tree.root.children[tuple(FIRST[:16])]
    assert sorted(c.offset for c in upper.children.values()) == [2, 4, 4]
    freed: list[int] = []
    tree.evict(2, lambda leaf: freed.extend(leaf.value))  # the least recently used leaf: the first prompt's
    assert freed == [101, 102]
    assert sorted(c.offset for c in upper.children.values()) == [2, 2], "200 and 300 share 2 tokens only"
    tree.check_invariants()


def test_a_match_parting_in_the_last_partial_block_reports_its_offset():
    tree = OffsetRadixTree(4)
    tree.insert(list(range(12)), [0, 1, 2])
    blocks, node, offset = tree.match([0, 1, 2, 3, 4, 5, 9])
    assert (blocks, tree.depth(node), offset) == ([0], 4, 2)
    blocks, node, offset = tree.match([0, 1, 2, 3, 4, 5])
    assert (blocks, offset) == ([0], 2), "a partial block of the request: its tokens match, its K/V is not lent"


def test_insert_wants_one_block_per_full_block_and_ignores_a_partial_one():
    tree = OffsetRadixTree(4)
    with pytest.raises(ValueError, match="10 tokens hold 2 full blocks, got 3 block ids"):
        tree.insert(list(range(10)), [1, 2, 3])
    assert tree.total_size == 0
    assert tree.insert(list(range(10)), [1, 2]) == 0
    assert tree.depth(tree.match(list(range(10)))[1]) == 8, "the tokens of a partial block are no key"
    tree.check_invariants()


def test_check_invariants_names_a_wrong_offset():
    tree = OffsetRadixTree(BS)
    tree.insert(FIRST, [100, 101, 102])
    tree.insert(SECOND, [100, 200])
    upper = tree.root.children[tuple(FIRST[:16])]
    next(iter(upper.children.values())).offset = 3
    with pytest.raises(AssertionError, match="offset 3, but its siblings' first blocks share 4 leading tokens"):
        tree.check_invariants()


@pytest.mark.task("task5.offset")
def test_branch_offset_of_the_textbook_split():
    """The first prompt's second block against the second prompt's: they share 4 leading tokens, either way round."""
    assert branch_offset(FIRST[16:32], [SECOND[16:32]]) == 4
    assert branch_offset(SECOND[16:32], (b for b in [FIRST[16:32]])) == 4, "siblings may come as any iterable"


@pytest.mark.task("task5.offset")
def test_branch_offset_is_the_most_any_sibling_shares():
    assert branch_offset([1, 2, 3, 4], [[1, 2, 9, 9], [1, 2, 3, 9], [7, 2, 3, 4]]) == 3, \
        "leading tokens only: the last sibling shares three tokens, none of them at the head"
    assert branch_offset((5, 6, 7), [(5, 6, 8), (9, 9, 9)]) == 2, "blocks may come as tuples (the tree's keys)"
    assert branch_offset([5, 6, 7], [[5, 6]]) == 2, "a shorter block: a match at the end of a request's tokens"


@pytest.mark.task("task5.offset")
def test_branch_offset_without_a_sibling_is_zero():
    assert branch_offset([1, 2, 3], []) == 0
    assert branch_offset([1, 2, 3], [[4, 2, 3]]) == 0, "the first slot differs: no dead slot"


def test_the_picture_draws_the_split_with_its_offsets():
    from step05_bridge.pictures import offset_split_dot

    dot = offset_split_dot()
    assert dot == offset_split_dot(), "deterministic"
    before, after = dot.split("cluster_b")[1], dot.split("cluster_a")[1].split("cluster_b")[0]
    assert "positions 0–47" in before and "<TD>100</TD><TD>101</TD><TD>102</TD>" in before and "slots 0–" not in before
    assert '<TD BGCOLOR="#cccccc">slots 0–3</TD><TD>101</TD><TD>102</TD>' in after, "the dead slots of 101, greyed"
    assert '<TD BGCOLOR="#cccccc">slots 0–3</TD><TD>200</TD>' in after and "positions 0–15" in after
    assert after.count("offset 4: own tokens from 20") == 2
    assert '"26 27 28 29 | 30 31 32 33 …"' in after and '"26 27 28 29 | 90 91 92 93 …"' in after, \
        "each branch's edge: its dead slots' tokens, a bar, its own"
