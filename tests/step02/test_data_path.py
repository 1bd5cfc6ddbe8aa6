"""Chapter 2's batching unit lists the files one decode step crosses, in order: a traced step keeps the list true. Every
listed file is reached, in the listed order; every other file of the course the step reaches is named as a helper;
the list stays short enough to read (12 files at most)."""
from __future__ import annotations

import re
import sys

from course.paths import REPO_ROOT
from step01_kvcache.request import SamplingParams
from step01_kvcache.tiny import tiny_model
from step02_paged import Engine, EngineConfig

README = REPO_ROOT / "step02_paged" / "02_batching.md"  # the unit that teaches the decode step


def lesson_block() -> str:
    text = README.read_text()
    return text[text.index("<!-- data-path:begin -->"): text.index("<!-- data-path:end -->")]


def listed() -> list[str]:
    """The numbered files, as paths from the repository root."""
    links = re.findall(r"^\d+\. \[`[^`]+`\]\(([^)]+)\)", lesson_block(), re.M)
    return [str((README.parent / link).resolve().relative_to(REPO_ROOT)) for link in links]


def traced_decode_step() -> list[str]:
    """The course's files a decode step reaches, in first-call order: a sequence of 8 tokens in blocks of 4 decodes
    its first token, which opens a third block."""
    engine = Engine(tiny_model(seed=0), EngineConfig(num_blocks=64, block_size=4))
    engine.add_request(list(range(1, 9)), SamplingParams(max_new_tokens=4))
    engine.step()  # the prefill
    assert [n for _, n in engine.last_scheduled] == [8]
    order: list[str] = []

    def on_call(frame, event, arg):
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(str(REPO_ROOT)) and ".venv" not in path and path not in order:
            order.append(path)

    sys.setprofile(on_call)
    try:
        engine.step()
    finally:
        sys.setprofile(None)
    assert [n for _, n in engine.last_scheduled] == [1], "the traced step was meant to be a decode"
    return [str(p.removeprefix(str(REPO_ROOT) + "/")) for p in order]


def test_the_lesson_lists_the_decode_steps_files_in_order():
    files, reached = listed(), traced_decode_step()
    assert 0 < len(files) <= 12, f"{len(files)} files: the list is meant to be read in one go"
    missing = [f for f in files if f not in reached]
    assert not missing, f"listed but not on a decode step's path: {missing}"
    positions = [reached.index(f) for f in files]
    assert positions == sorted(positions), f"the step reaches them in this order: {sorted(files, key=reached.index)}"
    helpers = [f for f in reached if f not in files]
    unnamed = [f for f in helpers if f"`{f.rsplit('/', 1)[-1]}`" not in lesson_block()]
    assert not unnamed, f"files the step reaches that the lesson neither lists nor names as helpers: {unnamed}"
