"""ModelRunner: the engine's one way to the model — a step's `ForwardBatch` in, the logits of its sampled rows out.

The engine schedules, builds the batch and samples; the runner runs the forward over the KV pool: it asks the
attention backend for the step's KV store, runs chapter 1's model and applies the LM head to the rows that sample
(the last token of each sequence that reached its end, not every prompt token). Chapter 6 replaces it with a runner
that replays CUDA graphs for the same contract (vLLM's `GPUModelRunner`, SGLang's `ModelRunner` and
`CudaGraphRunner` split the work the same way); the engine never knows which one it has.
"""
from __future__ import annotations

import torch

from step01_kvcache.model import Transformer

from .attention_backend import AttentionBackend
from .forward_batch import ForwardBatch
from .kv_pool import KVPool


class ModelRunner:
    """The eager forward of one engine step."""

    def __init__(self, model: Transformer, attention: AttentionBackend, pool: KVPool) -> None:
        self.model, self.attention, self.pool = model, attention, pool

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [S, vocab] of the batch's sampled rows (`batch.logits_indices`), in that order."""
        hidden = self.model(batch.input_ids, batch.positions, self.attention.for_step(self.pool, batch))
        if batch.logits_indices.shape[0] != hidden.shape[0]:  # a decode step samples every row: no gather
            hidden = hidden[batch.logits_indices]
        return self.model.compute_logits(hidden)
