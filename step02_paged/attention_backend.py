"""The attention contract: what an engine step hands an attention backend, what the backend builds once per step,
and what each layer of the model calls. Every attention of the course follows it: this chapter's `PagedAttention`
(torch, gathers K/V), chapter 6's `TritonPagedAttention` (kernels that read the pool in place) and, through the
same call, chapter 6's CUDA-graph runner.

Per step a backend gets two things, both typed here and nothing else:
- the step's `ForwardBatch` (forward_batch.py): the flat rows, decodes first, with positions, `slot_mapping`,
  `seq_lens`, `query_start_loc` and the step's rows of the persistent block table; and `cascade`, the decode rows
  that share a prefix (`CascadeGroup`s), empty unless the engine holds a cascade policy (chapter 6). A backend may
  ignore the groups: they only say that some rows read the same first blocks;
- the `KVPool` (kv_pool.py): per layer, K and V in the pool's dtype, and `layer_scales(layer)`, the scales a
  quantized pool stores beside them (None for a pool in the model's dtype; chapter 6's FP8 pool has them).
Once per step it builds its metadata (`md`: views and small host-side numbers, in O(what the step runs), without
waiting for the device) and returns the step's `StepAttention`; every layer then calls `attend(layer, q, k, v)`,
which stores the step's K/V and attends. vLLM splits the same contract into an `AttentionMetadataBuilder.build`
per step and an `AttentionImpl.forward` per layer; mini-sglang's `BaseAttnBackend` into `prepare_metadata` and
`forward`; FlashInfer's wrappers into `plan` and `run`.

`python -m mypy` checks this file and its implementations (`make test` runs it): a backend that reads a field the
contract does not give fails there, not at run time.
"""
from __future__ import annotations

from typing import Protocol, TypeVar

import torch

from step01_kvcache.attention import KVStore

from .forward_batch import ForwardBatch
from .kv_pool import KVPool

M = TypeVar("M", covariant=True)


class StepAttention(KVStore, Protocol[M]):
    """One step's KV store (chapter 1's `KVStore`), with the metadata it built once for every layer."""

    @property
    def md(self) -> M:
        """The step's metadata: what the layers read, built once by `for_step`."""
        ...

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this step's k, v [T, Hkv, D] of `layer` into the pool at `md`'s slots, then attend q [T, Hq, D]
        over each row's context; returns [T, Hq * D] in the batch's row order."""
        ...


class AttentionBackend(Protocol):
    """What an engine holds: `for_step` reads the step's batch and pool once and returns the step's store."""

    def for_step(self, pool: KVPool, batch: ForwardBatch) -> StepAttention[object]:
        ...
