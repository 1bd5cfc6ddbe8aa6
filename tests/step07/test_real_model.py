"""On the real SmolLM2: the demo, which asks through the server and the `openai` client, answers what chapter 1's
demo answers."""
from __future__ import annotations

import pytest

from tests.driver import demo_answer_matches_step01


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_answer_only_matches_step01(capsys):
    from step07_serving.__main__ import main

    demo_answer_matches_step01(main, capsys)
    assert main(["--block-size", "0", "--answer-only"]) == 2, "a bad block size is a clear error"
