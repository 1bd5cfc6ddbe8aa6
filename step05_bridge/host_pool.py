"""HostPool: a second tier of KV blocks in host memory, under the device pool (SGLang's HiCache, vLLM's CPU
offloading).

When the device pool is full, the bridge does not drop an evicted prefix: it copies the prefix's blocks here and
keeps their tokens in a second tree (bridge_cache.py). A later request that finds them copies them back, which is
cheaper than recomputing them when the span is long enough: a block's K/V is `2 · layers · block_size ·
kv_heads · head_dim` numbers to move, against about `2 · parameters` FLOPs per token to recompute (the lesson
works the crossover out).

Layout: [num_blocks, num_layers, block_size, kv_heads, head_dim] for K and for V — block-major, where the device
pool is layer-major, so that one block across all layers is one contiguous piece of host memory. On a GPU the
host pool is pinned and copies run on a side stream: a load is queued without making the host wait, and the
device's own stream waits for it before the next forward reads the blocks. Both directions first wait for the
work already queued on the device stream: a block freed a moment ago may still be written by a step in flight.
"""
from __future__ import annotations

import torch

from step02_paged.block_manager import BlockManager
from step02_paged.kv_pool import KVPool


class HostPool:
    """K/V storage in host memory for `num_blocks` blocks of the device pool's shape, with its own BlockManager."""

    def __init__(self, pool: KVPool, num_blocks: int) -> None:
        layers, _, block_size, heads, dim = pool.k.shape
        on_gpu = pool.k.is_cuda
        shape = (num_blocks, layers, block_size, heads, dim)
        with torch.inference_mode(False):  # made during a step or not, it is written outside one too (an eviction)
            self.k = torch.zeros(shape, dtype=pool.k.dtype, pin_memory=on_gpu)
            self.v = torch.zeros(shape, dtype=pool.k.dtype, pin_memory=on_gpu)
            # What a block carries beside K and V (an FP8 pool's scale per token) moves with it, or the block would be
            # read back with whatever its new device block held before.
            self.scales = [torch.zeros((num_blocks, *s[:, 0].shape), dtype=s.dtype, pin_memory=on_gpu)
                           for s in pool.per_slot_tensors()]
        self.pool = pool
        self.block_manager = BlockManager(num_blocks)
        self.stream = torch.cuda.Stream(pool.k.device) if on_gpu else None
        self.blocks_saved = self.blocks_loaded = 0

    @property
    def bytes_per_block(self) -> int:
        return 2 * self.k[0].nbytes + sum(s[0].nbytes for s in self.scales)

    def _device_scales(self) -> tuple[torch.Tensor, ...]:
        return self.pool.per_slot_tensors()

    def _index(self, blocks: list[int], device: torch.device) -> torch.Tensor:
        ids = torch.tensor(blocks, dtype=torch.long)
        return ids.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else ids

    def save(self, device_blocks: list[int], host_blocks: list[int]) -> None:
        """Copy device blocks to host blocks. Returns once the copy is done (the device blocks are freed next)."""
        src, dst = self._index(device_blocks, self.pool.k.device), torch.tensor(host_blocks, dtype=torch.long)
        # BEGIN SOLUTION task5.host_tier points=2
        if self.stream is None:
            self.k[dst] = self.pool.k[:, src].transpose(0, 1)
            self.v[dst] = self.pool.v[:, src].transpose(0, 1)
        else:
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                k, v = (t[:, src].transpose(0, 1).cpu() for t in (self.pool.k, self.pool.v))  # waits for the copy
            self.k[dst], self.v[dst] = k, v
        # END SOLUTION
        for host, device in zip(self.scales, self._device_scales()):  # after the device stream's work, like the bytes
            host[dst] = device[:, src].transpose(0, 1).cpu()
        self.blocks_saved += len(device_blocks)

    def load(self, host_blocks: list[int], device_blocks: list[int]) -> None:
        """Copy host blocks into device blocks. On a GPU it is queued, not waited for: the device stream waits."""
        src, dst = torch.tensor(host_blocks, dtype=torch.long), self._index(device_blocks, self.pool.k.device)
        # BEGIN SOLUTION task5.host_tier points=2
        if self.stream is None:
            self.pool.k[:, dst] = self.k[src].transpose(0, 1)
            self.pool.v[:, dst] = self.v[src].transpose(0, 1)
        else:
            staged = [torch.empty((len(host_blocks), *t.shape[1:]), dtype=t.dtype, pin_memory=True)
                      for t in (self.k, self.v)]
            torch.index_select(self.k, 0, src, out=staged[0])
            torch.index_select(self.v, 0, src, out=staged[1])
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                for target, part in zip((self.pool.k, self.pool.v), staged):
                    target[:, dst] = part.to(target.device, non_blocking=True).transpose(0, 1)
            torch.cuda.current_stream().wait_stream(self.stream)
        # END SOLUTION
        for host, device in zip(self.scales, self._device_scales()):  # on the device stream, which the next step uses
            device[:, dst] = host[src].to(device.device).transpose(0, 1)
        self.blocks_loaded += len(host_blocks)
