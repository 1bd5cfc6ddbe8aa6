"""The shared workloads: their sizes are contracts (chapters' bars quote them), measured with the real tokenizer."""
from __future__ import annotations

import json

import pytest

from course.workloads import (
    BLOCK,
    DIVERGE_SHARED_PREFIX,
    WORKLOADS,
    Workload,
    get_workload,
    reusable_tokens,
    shared_prefix_len,
)
from course.workloads_page import main


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_workload_builds(name):
    w = get_workload(name)
    assert isinstance(w, Workload) and w.name == name and w.description
    assert w.messages and w.rounds >= 1
    for chat in w.messages:
        roles = [m["role"] for m in chat]  # a system prompt, then turns; the last one is the user's question
        assert roles[0] == "system" and roles[1::2] == ["user"] * len(roles[1::2]) and roles[-1] == "user"
        assert roles[2::2] == ["assistant"] * len(roles[2::2])
        assert all(isinstance(m["content"], str) and m["content"].strip() for m in chat)


def test_bad_name_lists_valid_names():
    with pytest.raises(ValueError, match="short.*long.*shared_prefix"):
        get_workload("nope")


def test_shared_prefix_len():
    assert shared_prefix_len([]) == 0
    assert shared_prefix_len([[1, 2, 3]]) == 3
    assert shared_prefix_len([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert shared_prefix_len([[1, 2], [3, 2]]) == 0
    assert reusable_tokens([[1, 2, 3], [1, 2, 4], [1, 9], [1, 2, 4, 5]]) == [0, 2, 1, 3]


@pytest.mark.slow
def test_short(tokenizer):
    prompts = get_workload("short").prompts(tokenizer)
    assert len(prompts) == 9
    assert all(135 <= len(p) <= 155 for p in prompts), [len(p) for p in prompts]
    # round r of persona p reuses that persona's system prompt from round 1
    assert shared_prefix_len([prompts[0], prompts[3], prompts[6]]) > 100
    assert shared_prefix_len(prompts[:3]) < 20


@pytest.mark.slow
def test_long(tokenizer):
    prompts = get_workload("long").prompts(tokenizer)
    assert len(prompts) == 8
    shared = shared_prefix_len(prompts)
    assert shared >= 2060
    new = [len(p) - shared for p in prompts]
    assert all(28 <= n <= 48 for n in new), new


@pytest.mark.slow
def test_shared_prefix(tokenizer):
    w = get_workload("shared_prefix")
    prompts = w.prompts(tokenizer)
    assert len(prompts) == 10 and w.rounds == 2
    assert shared_prefix_len(prompts) >= 100
    assert len({tuple(p) for p in prompts}) == 10


@pytest.mark.slow
def test_batch(tokenizer):
    prompts = get_workload("batch").prompts(tokenizer)
    lengths = [len(p) for p in prompts]
    assert len(prompts) == 8
    assert min(lengths) <= 30 and max(lengths) >= 250, lengths
    assert shared_prefix_len(prompts) <= 5  # only the template's opening tokens


@pytest.mark.slow
def test_diverge(tokenizer):
    prompts = get_workload("diverge").prompts(tokenizer)
    shared = shared_prefix_len(prompts)
    assert shared == DIVERGE_SHARED_PREFIX
    assert shared % BLOCK != 0
    assert all(len(p) > shared for p in prompts)
    # the prefix breaks within a block, at the same token for every pair
    assert all(shared_prefix_len([prompts[0], p]) == shared for p in prompts[1:])


@pytest.mark.slow
def test_multi_doc(tokenizer):
    """4 documents x 3 questions, interleaved: each request shares its document with the request 4 before it and
    little more than the template with the others."""
    prompts = get_workload("multi_doc").prompts(tokenizer)
    assert len(prompts) == 12 and all(180 <= len(p) <= 240 for p in prompts), [len(p) for p in prompts]
    for i, p in enumerate(prompts):
        for j, q in enumerate(prompts[:i]):
            shared = shared_prefix_len([p, q])
            assert shared >= 170 if i % 4 == j % 4 else shared <= 16, (i, j, shared)
    assert sum(len(p) for p in prompts[:4]) > 2 * max(len(p) for p in prompts), \
        "a pool for two requests at a time cannot keep all four documents"


@pytest.mark.slow
def test_main_json(capsys):
    assert main(["short", "diverge", "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    stats = json.loads(last)["workloads"]
    assert set(stats) == {"short", "diverge"}
    assert stats["diverge"]["shared_prefix"] == DIVERGE_SHARED_PREFIX
    assert stats["short"]["requests"] == 9


def test_main_rejects_bad_name(capsys):
    with pytest.raises(SystemExit) as e:
        main(["nope"])
    assert e.value.code == 2
    assert "valid names" in capsys.readouterr().err


def test_the_workloads_block_is_the_engines():
    """`diverge` is built around the block the engines use by default; course/ cannot import the engine's config,
    so this test ties the two numbers together."""
    from step02_paged import EngineConfig

    assert BLOCK == EngineConfig.block_size
