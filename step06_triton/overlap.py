"""Overlap scheduling: the host schedules and launches step N+1 while the device still runs step N (SGLang's
overlap scheduler, vLLM's async scheduling).

Chapter 2's engine waits at the end of every step: it reads the sampled tokens back to the host (the one
host-device synchronisation of a step) before it schedules the next one, and on a GPU the device idles while the
host schedules and builds the next batch. `OverlapEngine` is chapter 2's engine with that wait moved one step on:
- a step's sampled tokens stay on the device; a pinned host copy starts at once, with an event to wait on;
- the next step is scheduled and launched before they are read. A decode whose token is still on the device runs
  with a *placeholder*: its input row takes the id from the previous step's output tensor, on the device;
- the host then reads the previous step's tokens, appends them and retires what finished. A request that finished
  is noticed one step late: the extra token it sampled meanwhile is dropped;
- a request that sampled all it may, its last tokens still in flight, has nothing to run: it waits to be read.
The counts of tokens in flight live on each sequence (`Sequence.num_in_flight`), written here only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from step02_paged.engine import Engine, RequestOutput
from step02_paged.forward_batch import ForwardBatch
from step02_paged.sequence import Sequence


def check_no_speculation(num_speculative_tokens: int) -> None:
    """The overlapped engine schedules step N+1 before it reads step N's tokens, each a placeholder one position
    on; a verify step keeps an unknown number of tokens (1 .. 1 + drafts), so the next step's positions are not
    known when it is scheduled. vLLM's asynchronous scheduler runs the pair by counting the scheduled drafts as
    placeholders and taking the rejected ones back when the tokens arrive; this course does not build that, so the
    combination is refused."""
    if num_speculative_tokens:
        raise ValueError(f"num_speculative_tokens={num_speculative_tokens} needs the synchronous engine: the "
                         "overlapped engine schedules the next step before it knows how many drafts were accepted; "
                         "use overlap=False (chapter 2's Engine) or num_speculative_tokens=0")


@dataclass
class Launched:
    """A step whose forward is queued: the sequences it samples and their tokens, on the device, with a host copy
    on its way (on a GPU)."""

    sampled: list[Sequence]
    tokens: torch.Tensor  # [len(sampled)] on the model's device
    host: torch.Tensor | None = None  # pinned host copy, filled once `ready` has passed
    ready: torch.cuda.Event | None = None

    @classmethod
    def start(cls, sampled: list[Sequence], tokens: torch.Tensor) -> Launched:
        launched = cls(sampled, tokens)
        if tokens.is_cuda:  # start the copy back now; `read` waits for it only when the tokens are needed
            launched.host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            launched.host.copy_(tokens, non_blocking=True)
            launched.ready = torch.cuda.Event()
            launched.ready.record()
        return launched

    def index(self) -> dict[int, int]:
        """seq_id -> its token's index in `tokens`."""
        return {s.seq_id: i for i, s in enumerate(self.sampled)}

    def read(self) -> list[int]:
        """The sampled tokens as ints: the one point where the host waits for the device."""
        if self.ready is None:
            return self.tokens.tolist()
        self.ready.synchronize()
        return self.host.tolist()


class OverlapEngine(Engine):
    """Chapter 2's engine whose step reads the previous step's tokens after launching its own."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._inflight: Launched | None = None  # the step launched last, its tokens not read yet

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or self._inflight is not None

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Schedule and launch this step, then read the previous step's tokens. Returns what finished."""
        batch = self._schedule()
        launched = self._launch(batch) if batch else None
        previous, self._inflight = self._inflight, launched
        finished = self._read(previous) if previous else []
        if batch:
            self._record_step()
        return finished

    def _launch(self, batch: list[tuple[Sequence, int]]) -> Launched:
        """Queue the forward and the sampling; every sampled sequence has one more token in flight."""
        ids, holes = self._token_ids(batch)
        forward_batch, sampled = self._prepare(batch, ids)
        if holes:
            self._fill_placeholders(forward_batch, holes)
        tokens = self._sample(self.runner.forward(forward_batch), sampled)
        self._advance(batch)
        for seq in sampled:
            seq.num_in_flight += 1
        return Launched.start(sampled, tokens)

    def _token_ids(self, batch: list[tuple[Sequence, int]]) -> tuple[list[int], list[tuple[int, int]]]:
        """The step's token ids in batch order, 0 where a token is still on the device, and those places:
        (flat row, index of the token in the previous step's output)."""
        ids: list[int] = []
        holes: list[tuple[int, int]] = []
        index = self._inflight.index() if self._inflight else {}
        for seq, n in batch:
            c = seq.num_computed_tokens
            known = seq.all_token_ids[c: c + n]
            if len(known) < n:  # the last token is a placeholder
                holes.append((len(ids) + len(known), index[seq.seq_id]))
                known = known + [0]
            ids += known
        return ids, holes

    def _fill_placeholders(self, batch: ForwardBatch, holes: list[tuple[int, int]]) -> None:
        """Write the previous step's tokens into their rows, on the device, without waiting for them."""
        at = torch.tensor(holes, dtype=torch.long).T
        if batch.input_ids.is_cuda:
            at = at.pin_memory().to(batch.input_ids.device, non_blocking=True)
        batch.input_ids[at[0]] = self._inflight.tokens[at[1]]

    def _read(self, launched: Launched) -> list[RequestOutput]:
        """Read a launched step's tokens; append them; retire what finished. A sequence that finished or was
        aborted since the launch drops its token."""
        tokens = launched.read()
        for seq in launched.sampled:  # every count first: nothing below can leave one behind
            seq.num_in_flight -= 1
        live = [i for i, seq in enumerate(launched.sampled) if not seq.is_finished]
        return self._append([launched.sampled[i] for i in live], [tokens[i] for i in live])

    def check_invariants(self) -> None:
        """Chapter 2's, and the one count this engine writes: each live sequence has as many tokens in flight as
        the launched step sampled for it (one, or none)."""
        super().check_invariants()
        launched = {s.seq_id for s in self._inflight.sampled if s.seq_id in self.seqs} if self._inflight else set()
        in_flight = {s.seq_id: s.num_in_flight for s in self.seqs.values() if s.num_in_flight}
        assert in_flight == dict.fromkeys(launched, 1), \
            f"tokens in flight {in_flight}, but the launched step sampled {sorted(launched)} unread"
