"""BlockTable: the block tables of the running sequences as one persistent tensor, kept in step with small edits.

Attention reads a sequence's blocks from a tensor row, not from a Python list. Building that tensor anew every
step costs O(context) per sequence (a 2k-token context at block size 1 is 2k entries, every step). So, as in
vLLM's `BlockTable`, each running sequence owns a row of a `[max_num_seqs, max_blocks]` tensor for its whole
stay, and a step writes only the entries that changed: the blocks appended since the last step (and the rare
entry a prefix cache rewrote in place, see `Sequence.rewrite_blocks`). The host keeps a staging copy (`cpu`),
where slot mappings are looked up; the edits of a step travel to the device with the step's other inputs in one
copy (`ForwardBatch`), so the device copy (`device`) costs no extra transfer. On a CPU the two are one tensor.
"""
from __future__ import annotations

import numpy as np
import torch

from .sequence import Sequence

_EMPTY = np.zeros(0, np.int64)


class BlockTable:
    """Rows of block ids (int32), one per running sequence; `sync` records edits, the batch applies them."""

    def __init__(self, max_rows: int, max_blocks: int, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.cpu = torch.zeros(max_rows, max_blocks, dtype=torch.int32)
        self.device_table = self.cpu if self.device.type == "cpu" else torch.zeros_like(self.cpu, device=self.device)
        self.max_blocks = max_blocks
        self.np = self.cpu.numpy()  # a view: writes through numpy land in the tensor
        self._free_rows = list(range(max_rows - 1, -1, -1))
        self.rows: dict[int, int] = {}  # seq_id -> row
        self._edits: list[tuple[np.ndarray, np.ndarray]] = []  # (flat indices, block ids) since the last take

    def sync(self, seqs: list[Sequence]) -> list[int]:
        """The sequences' rows (a new one on first use), brought up to date with one write for the whole batch:
        only the entries added (or rewritten) since the last sync, usually one block now and then per sequence."""
        rows, at, values = [], [], []
        for seq in seqs:
            row = self.rows.get(seq.seq_id)
            if row is None:
                if not self._free_rows:
                    raise RuntimeError(f"no free block-table row for sequence {seq.seq_id}: more running sequences "
                                       f"than the {len(self.rows)} rows (max_num_seqs)")
                row = self.rows[seq.seq_id] = self._free_rows.pop()
                seq.synced_blocks = 0
            rows.append(row)
            start, end = seq.synced_blocks, len(seq.block_table)
            if start < end:
                if end > self.max_blocks:
                    raise ValueError(f"sequence {seq.seq_id} holds {end} blocks; a row holds {self.max_blocks}")
                first = row * self.max_blocks
                at.extend(range(first + start, first + end))
                values += seq.block_table[start:end]
                seq.synced_blocks = end
        if at:
            index, blocks = np.array(at), np.array(values, dtype=np.int32)
            self.np.reshape(-1)[index] = blocks
            if self.device_table is not self.cpu:
                self._edits.append((index, blocks))
        return rows

    def release(self, seq_id: int) -> None:
        """The sequence stopped running (finished, aborted or preempted): its row is free for another."""
        row = self.rows.pop(seq_id, None)
        if row is not None:
            self._free_rows.append(row)

    def take_edits(self) -> tuple[np.ndarray, np.ndarray]:
        """(flat indices, block ids) of every entry written since the last call, for the device copy."""
        if not self._edits:
            return _EMPTY, _EMPTY
        index, values = (np.concatenate(parts) for parts in zip(*self._edits))
        self._edits.clear()
        return index, values

    def check_invariants(self, seqs: list[Sequence]) -> None:
        """Every running sequence's row starts with its block table, on the host and, once edits are applied, on
        the device; a row belongs to one sequence."""
        assert len(set(self.rows.values())) == len(self.rows), "a block-table row is given to two sequences"
        for seq in seqs:
            row = self.rows.get(seq.seq_id)
            if row is None:
                continue
            n = seq.synced_blocks
            assert self.np[row, :n].tolist() == seq.block_table[:n], \
                f"sequence {seq.seq_id}: block-table row {row} differs from its block table"
