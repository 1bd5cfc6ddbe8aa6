"""SpeculativeConfig: how many guesses a decode step verifies, and how prompt lookup finds them.

The speculative engine's own settings, checked here and nowhere else (vLLM's `SpeculativeConfig` with
`method="ngram"` holds the same three). Chapter 2's `EngineConfig` knows nothing of them: a plain engine has no field
it would have to ignore.
"""
from __future__ import annotations

from dataclasses import dataclass

from step02_paged.geometry import check_positive_int


@dataclass(frozen=True)
class SpeculativeConfig:
    num_speculative_tokens: int  # guesses verified per decode step, k >= 1
    prompt_lookup_min: int = 2  # the shortest suffix the prompt-lookup proposer matches (ngram_proposer.py)
    prompt_lookup_max: int = 4  # and the longest

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"num_speculative_tokens must be an int >= 1 (no guesses: use chapter 2's Engine), "
                             f"got {k!r}")
        check_positive_int("prompt_lookup_min", self.prompt_lookup_min)
        check_positive_int("prompt_lookup_max", self.prompt_lookup_max)
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError(f"prompt_lookup_max ({self.prompt_lookup_max}) must be >= prompt_lookup_min "
                             f"({self.prompt_lookup_min})")
