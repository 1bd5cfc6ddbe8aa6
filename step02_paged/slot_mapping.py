"""Address translation, with tensor ops: (sequence, token position) -> physical slot in the KV pool.

Like a page table lookup: the block table maps a sequence's logical block `pos // block_size` to a
physical block, and the offset inside the block is `pos % block_size`.
"""
from __future__ import annotations

import torch


def block_table_tensor(block_tables: list[list[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    """Ragged block tables padded with 0 into one [batch, max_blocks] int64 tensor (padding is never read
    unmasked)."""
    width = max((len(t) for t in block_tables), default=0) or 1
    rows = [table + [0] * (width - len(table)) for table in block_tables]
    return torch.tensor(rows, dtype=torch.long, device=device).view(len(block_tables), width)


def flat_batch(num_computed: torch.Tensor, num_new: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's flat batch: sequence i runs positions num_computed[i] .. num_computed[i] + num_new[i] - 1 as
    consecutive rows. Returns (seq_index, positions, starts): each row's sequence and absolute position, and
    each sequence's first row. Tensor ops only, no loop over tokens."""
    # BEGIN SOLUTION task2.slot_mapping points=2
    seq_index = torch.repeat_interleave(torch.arange(num_new.shape[0], device=num_new.device), num_new)
    starts = torch.cumsum(num_new, 0) - num_new
    positions = num_computed[seq_index] + torch.arange(int(num_new.sum()), device=num_new.device) - starts[seq_index]
    return seq_index, positions, starts
    # END SOLUTION


def slot_mapping(block_tables: torch.Tensor, seq_index: torch.Tensor, positions: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """Slot of each token: block_tables [B, max_blocks]; seq_index, positions: which row and which position,
    any two shapes that broadcast together (the result has their broadcast shape). Tensor ops only."""
    # BEGIN SOLUTION task2.slot_mapping points=2
    blocks = block_tables[seq_index, positions // block_size]
    return blocks * block_size + positions % block_size
    # END SOLUTION


def context_slots(block_tables: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """Slots of positions 0..context_len-1 for every row: [B, context_len], in one `slot_mapping` call.
    Rows shorter than context_len read padding there, which attention masks out."""
    # BEGIN SOLUTION task2.slot_mapping points=2
    positions = torch.arange(context_len, device=block_tables.device)
    rows = torch.arange(block_tables.shape[0], device=block_tables.device)[:, None]
    return slot_mapping(block_tables, rows, positions[None, :], block_size)
    # END SOLUTION
