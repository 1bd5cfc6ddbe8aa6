"""A request as the engine sees it: tokens, how many of them have K/V in the pool, and its block table.

One counter drives everything (as in vLLM v1): `num_computed_tokens`. The tokens still to run are the ones
after it — the rest of the prompt while prefilling (in chunks), then the one token sampled last step while
decoding. Only the scheduler and the engine move it, through three methods: `admit` (a new request starts
after its cached prefix), `advance` (a forward computed n more tokens) and `preempt` (its blocks were released:
back to 0, to be recomputed later, prompt and answer so far together); chapter 5's speculative engine also takes
rejected guesses back (its `rollback`). A cache manager reads it, never writes it.

Speculative decoding proposes draft tokens (`spec_token_ids`, vLLM's name) that the next step runs after the
pending token, to verify them all in one forward. They are pending tokens like any other (the scheduler budgets
and allocates for them), but they are not the sequence's tokens: `all_token_ids` holds verified tokens only, so
nothing that names a sequence's content (chapter 3's block hashes, chapters 4-5's tree) ever sees a draft.

The tokens live in one list, `all_token_ids`, grown in place: reading a step's tokens costs what the step runs,
not what the sequence holds. An engine that samples on a GPU and reads the tokens back a step later (chapter 6's
overlapped engine) counts the tokens sampled but not read yet in `num_in_flight`; they already take a position, so
everything that sizes a sequence asks `num_tokens_with_in_flight`. Chapter 2's engine reads every token in the
step that sampled it: there, `num_in_flight` is always 0.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from step01_kvcache.request import SamplingParams


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
    num_computed_tokens: int = 0  # tokens whose K/V are in the pool (or being written by a launched step)
    num_cached_tokens: int = 0  # of the prompt, found in the pool on first admission (a prefix hit)
    num_in_flight: int = 0  # tokens sampled on the device whose ids the host has not read yet (chapter 6)
    num_preemptions: int = 0
    synced_blocks: int = 0  # leading block_table entries the engine's block-table tensor already holds
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    generator: torch.Generator | None = None  # made by the engine, on the device that samples
    spec_token_ids: list[int] = field(default_factory=list)  # drafts to verify next step: never in all_token_ids

    def __post_init__(self) -> None:
        self.all_token_ids: list[int] = self.prompt_ids + self.output_ids  # read-only for everyone else

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens_with_in_flight(self) -> int:
        """Positions the sequence holds: its tokens, and those sampled but not read back yet."""
        return self.num_tokens + self.num_in_flight

    @property
    def num_positions(self) -> int:
        """Positions its block table may cover: its tokens, those in flight and its drafts (the scheduler makes room
        for drafts before the forward; a forward that raises leaves that room, and the next step uses it)."""
        return self.num_tokens_with_in_flight + len(self.spec_token_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens to run before the next sample: the rest of the prompt, or the last sampled token and the drafts
        after it. None once the sequence has sampled all it may: it only waits for its last tokens to be read
        (chapter 6)."""
        if len(self.output_ids) + self.num_in_flight >= self.params.max_new_tokens:
            return 0
        return self.num_tokens_with_in_flight - self.num_computed_tokens + len(self.spec_token_ids)

    @property
    def is_stalled(self) -> bool:
        """Nothing to run and no token on its way: a running sequence never is."""
        return self.num_pending_tokens < 1 and not self.num_in_flight

    @property
    def is_finished(self) -> bool:
        return self.status in (SequenceStatus.FINISHED, SequenceStatus.ABORTED)

    # ---- the counter's four writers ----------------------------------------------------------------------
    def admit(self, num_cached_tokens: int) -> None:
        """Scheduled for the first time (or again after a preemption): its first `num_cached_tokens` tokens were
        found in the pool. The prompt hit is recorded once per request: a recompute finds its own blocks."""
        self.num_computed_tokens = num_cached_tokens
        if not self.num_preemptions:
            self.num_cached_tokens = num_cached_tokens
        self.status = SequenceStatus.RUNNING

    def advance(self, num_tokens: int) -> None:
        """A forward was launched that writes the K/V of the next `num_tokens` tokens."""
        self.num_computed_tokens += num_tokens

    def preempt(self) -> None:
        """Its blocks were released: everything is recomputed when it is admitted again (its drafts are dropped)."""
        self.num_computed_tokens = 0
        self.synced_blocks = 0
        self.num_preemptions += 1
        self.status = SequenceStatus.WAITING
        self.spec_token_ids = []

    # ---- tokens and blocks -------------------------------------------------------------------------------
    def append_token(self, token: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        self.output_ids.append(token)
        self.all_token_ids.append(token)
        if token in self.params.stop_token_ids or len(self.output_ids) >= self.params.max_new_tokens:
            self.status = SequenceStatus.FINISHED
            self.finish_time = time.perf_counter()

    def rewrite_blocks(self, start: int, blocks: list[int]) -> None:
        """Point block_table[start:start + len(blocks)] at other blocks holding the same K/V (a prefix cache
        swapped a duplicate for its own copy). Appends need no call; an in-place change does, so that the
        engine copies the entries again."""
        old = self.block_table[start: start + len(blocks)]
        if old != blocks:
            first = start + next(i for i, (a, b) in enumerate(zip(old, blocks)) if a != b)
            self.block_table[start: start + len(blocks)] = blocks
            self.synced_blocks = min(self.synced_blocks, first)

    def truncate_blocks(self, keep: int) -> list[int]:
        """Cut the block table to its first `keep` entries (a rollback gave the rest back); returns the entries cut,
        for the caller to release. When the table grows again the engine copies the new entries from `keep` on."""
        cut = self.block_table[keep:]
        del self.block_table[keep:]
        self.synced_blocks = min(self.synced_blocks, keep)
        return cut

    def check_invariants(self) -> None:
        assert self.all_token_ids == self.prompt_ids + self.output_ids, \
            f"sequence {self.seq_id}: its token list is not its prompt and its answer"
        assert 0 <= self.num_computed_tokens <= self.num_tokens_with_in_flight, \
            f"sequence {self.seq_id}: {self.num_computed_tokens} computed of {self.num_tokens} tokens"
        assert 0 <= self.num_cached_tokens < self.num_prompt_tokens or self.num_cached_tokens == 0, \
            f"sequence {self.seq_id}: {self.num_cached_tokens} cached prompt tokens of {self.num_prompt_tokens}"
        assert 0 <= self.synced_blocks <= len(self.block_table), f"sequence {self.seq_id}: synced past its table"
        assert not self.spec_token_ids or self.status is SequenceStatus.RUNNING, \
            f"sequence {self.seq_id} is {self.status.value} and holds drafts"
