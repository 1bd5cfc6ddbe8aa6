"""ForwardBatch: everything one engine step's forward needs, built on the host in O(what the step runs) and
moved to the device in one copy.

The scheduler decided which sequences run and how many tokens each. From that alone (never from a sequence's
whole context) this file builds the flat batch [T] of the step's tokens, as tensors: token ids, absolute
positions (RoPE), `slot_mapping` (where each token's K/V goes), and per sequence its context length after the
step (`seq_lens`), where its rows start (`query_start_loc`, vLLM's name; FlashAttention's `cu_seqlens_q`) and
its row of the persistent block table. On a GPU all of it, with the block table's new entries, is packed into
one pinned host buffer and copied once, without waiting (SGLang's `ForwardBatch`, vLLM's input batch).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .block_table import BlockTable
from .sequence import Sequence
from .slot_mapping import block_table_tensor, flat_batch, slot_mapping


@dataclass(frozen=True)
class CascadeGroup:
    """Decode rows (indices into the step's batch) whose block tables start with the same `prefix_len` tokens: a
    backend may read that prefix once for all of them (chapter 6's cascade attention)."""

    rows: tuple[int, ...]
    prefix_len: int


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] token ids of the step, sequence after sequence
    positions: torch.Tensor  # [T] absolute position of each token (RoPE)
    slot_mapping: torch.Tensor  # [T] where each token's K/V is stored
    seq_lens: torch.Tensor  # [B] context of each sequence after this step
    query_start_loc: torch.Tensor  # [B + 1] first row of each sequence; the last entry is T
    rows: torch.Tensor  # [B] each sequence's row of `block_table`
    logits_indices: torch.Tensor  # [S] the rows whose hidden state is sampled (the last of a finished prefill;
    #                               a verify step's sequence samples its last 1 + drafts rows)
    block_table: torch.Tensor  # [max_rows, max_blocks] int32: the persistent table (rows of running sequences)
    block_size: int
    num_decodes: int  # the first num_decodes sequences run a single token each
    num_computed: tuple[int, ...]  # host copies: tokens each sequence had computed before the step
    num_new: tuple[int, ...]  # and the tokens it runs now
    cascade: tuple[CascadeGroup, ...] = ()  # decode rows sharing a prefix (an engine's cascade policy); () = none

    @property
    def num_seqs(self) -> int:
        return len(self.num_new)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    @property
    def context_lens(self) -> list[int]:
        """Host copies of `seq_lens`: each sequence's context after the step."""
        return [c + n for c, n in zip(self.num_computed, self.num_new)]

    @property
    def max_seq_len(self) -> int:
        return max(self.context_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.num_new)

    def block_tables(self) -> torch.Tensor:
        """[B, max_blocks]: the block tables of this step's sequences, in batch order (a gather on the device)."""
        return self.block_table.index_select(0, self.rows)

    @classmethod
    def build(cls, seqs: list[Sequence], num_new: list[int], table: BlockTable, block_size: int,
              sample_rows: list[int], token_ids: list[int] | None = None) -> ForwardBatch:
        """Sequence i runs tokens num_computed .. num_computed + num_new[i] - 1; single-token sequences first;
        the sequences listed in `sample_rows` (by batch index) are sampled after the forward, each at its last row,
        or, with drafts (`spec_token_ids`), at its last 1 + drafts rows: speculative decoding verifies each draft.
        `token_ids`, the step's tokens in batch order, defaults to the sequences' own (`step_token_ids`).

        Host arrays are numpy (a few microseconds per operation, where a small torch operation costs ten times
        more): this runs every step, and its cost is what the step runs, not what the sequences hold."""
        rows = np.array(table.sync(seqs))  # the rows, brought up to date: only new block ids are written
        computed = np.array([s.num_computed_tokens for s in seqs])
        counts = np.array(num_new)
        ids = step_token_ids(seqs, num_new) if token_ids is None else token_ids
        num_tokens = len(ids)
        if num_tokens == len(seqs):  # a decode step: one token per sequence, at its next position
            seq_index, positions, starts = np.arange(len(seqs)), computed, np.arange(len(seqs))
            slots = table.np[rows, positions // block_size].astype(np.int64) * block_size + positions % block_size
        else:  # chunks of several tokens: chapter 2's general flat batch and slot lookup
            seq_index, positions, starts = (t.numpy() for t in flat_batch(torch.from_numpy(computed),
                                                                          torch.from_numpy(counts)))
            slots = slot_mapping(table.cpu, torch.from_numpy(rows[seq_index]), torch.from_numpy(positions),
                                 block_size).numpy()
        edit_at, edit_ids = table.take_edits()
        logits_at = (starts + counts - 1)[sample_rows]
        reps = np.array([1 + len(seqs[i].spec_token_ids) for i in sample_rows], dtype=np.int64)
        if reps.size and reps.max() > 1:  # the last 1 + drafts rows of each sampled sequence, in order
            firsts = np.cumsum(reps) - reps
            logits_at = np.repeat(logits_at + 1 - reps, reps) + np.arange(reps.sum()) - np.repeat(firsts, reps)
        parts = [ids, positions, slots, computed + counts, np.append(starts, num_tokens), rows, logits_at]
        parts += [edit_at, edit_ids] if len(edit_at) else []
        flat = torch.from_numpy(np.concatenate(parts).astype(np.int64, copy=False))
        if table.device.type != "cpu":  # pinned, so that the copy does not make the host wait for the device
            flat = flat.pin_memory().to(table.device, non_blocking=True)
        views = flat.split([len(p) for p in parts])
        input_ids, positions_t, slots_t, seq_lens, qsl, rows_t, logits_at = views[:7]
        if len(edit_at):
            at, new = views[-2:]
            table.device_table.view(-1)[at] = new.to(torch.int32)
        num_decodes = next((i for i, n in enumerate(num_new) if n != 1), len(num_new))
        return cls(input_ids, positions_t, slots_t, seq_lens, qsl, rows_t, logits_at, table.device_table,
                   block_size, num_decodes, tuple(computed.tolist()), tuple(num_new))

    @classmethod
    def from_block_tables(cls, block_tables: list[list[int]], num_computed: list[int], num_new: list[int],
                          block_size: int, device: torch.device | str = "cpu") -> ForwardBatch:
        """A batch over block tables given by hand (tests, pictures): token ids are zeros."""
        table = block_table_tensor(block_tables, device).to(torch.int32)
        computed, counts = torch.tensor(num_computed, device=device), torch.tensor(num_new, device=device)
        seq_index, positions, starts = flat_batch(computed, counts)
        rows = torch.arange(len(num_new), device=device)
        num_decodes = next((i for i, n in enumerate(num_new) if n != 1), len(num_new))
        return cls(torch.zeros_like(positions), positions, slot_mapping(table, seq_index, positions, block_size),
                   computed + counts, torch.cat([starts, counts.sum().view(1)]), rows, starts + counts - 1, table,
                   block_size, num_decodes, tuple(num_computed), tuple(num_new))


def decodes_first(batch: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
    """The scheduler's (sequence, tokens) pairs with the single-token sequences first, in their order: the
    attention runs them as one batched decode (`ForwardBatch.num_decodes`)."""
    return sorted(batch, key=lambda item: item[1] != 1)


def step_token_ids(seqs: list[Sequence], num_new: list[int]) -> list[int]:
    """The ids of the tokens the step runs, sequence after sequence: each one's next `num_new` tokens, its drafts
    (`spec_token_ids`, never in `all_token_ids`) after its own tokens."""
    ids: list[int] = []
    for seq, n in zip(seqs, num_new):
        c = seq.num_computed_tokens
        ids += (seq.all_token_ids[c: c + n] + seq.spec_token_ids)[:n]
    return ids
