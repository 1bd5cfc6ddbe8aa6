"""A request as the engine sees it: tokens, how many of them have K/V in the pool, and its block table.

One counter drives everything (as in vLLM v1): `num_computed_tokens`. The tokens still to run are
`all_token_ids[num_computed_tokens:]` — the rest of the prompt while prefilling (in chunks), then the
one token sampled last step while decoding. Preemption just releases the blocks and sets the counter
back to 0: the sequence is recomputed later, prompt and answer so far together.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from step01_kvcache.generate import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued (new, or preempted and to be recomputed)
    RUNNING = "running"  # has blocks; prefilling in chunks or decoding
    FINISHED = "finished"  # stop token or max_new_tokens reached
    ABORTED = "aborted"  # removed by the caller


@dataclass(eq=False)
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)  # logical block i -> physical block id
    num_computed_tokens: int = 0  # tokens whose K/V are in the pool
    num_cached_tokens: int = 0  # of the prompt, found in the pool on first admission (a prefix hit)
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        self.generator = self.params.make_generator()

    def record_prompt_hit(self, num_tokens: int) -> bool:
        """A prefix cache served `num_tokens` of the prompt at admission. Counted once per request: after a
        preemption the recompute finds the request's own blocks again, which is no prompt hit. True if counted."""
        if self.num_preemptions:
            return False
        self.num_cached_tokens = num_tokens
        return True

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens to run before the next sample: the rest of the prompt, or the last sampled token."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status in (SequenceStatus.FINISHED, SequenceStatus.ABORTED)

    def append_token(self, token: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        self.output_ids.append(token)
        if token in self.params.stop_token_ids or len(self.output_ids) >= self.params.max_new_tokens:
            self.status = SequenceStatus.FINISHED
            self.finish_time = time.perf_counter()

    def check_invariants(self) -> None:
        assert 0 <= self.num_computed_tokens <= self.num_tokens, \
            f"sequence {self.seq_id}: {self.num_computed_tokens} computed of {self.num_tokens} tokens"
        assert 0 <= self.num_cached_tokens < self.num_prompt_tokens or self.num_cached_tokens == 0, \
            f"sequence {self.seq_id}: {self.num_cached_tokens} cached prompt tokens of {self.num_prompt_tokens}"
