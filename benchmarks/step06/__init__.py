"""Chapter 6's measurements on a GPU, apart from the teaching code: each module checks what it times against a
reference, then writes JSON under step06_triton/results/ that report.py turns into the lesson's tables.

- `kernels.py` — the kernels against what a user would pick instead (`python -m benchmarks.step06.kernels`);
- `engine.py` — the engine end to end against Hugging Face `generate`, and where a step's time goes
  (`python -m benchmarks.step06.engine`);
- `cascade.py` — cascade attention: one layer's decode attention, and the engine, with and without it
  (`python -m benchmarks.step06.cascade`);
- `fp8.py` — an FP8 KV cache on the GPU: ragged decode and extend over an FP8 pool, and the capacity it buys
  (`python -m benchmarks.step06.fp8`);
- `fp8_ablation.py` — where the FP8 decode's time goes: the kernel's scale arithmetic changed, variant by variant
  (`python -m benchmarks.step06.fp8_ablation`);
- `fp8_accuracy.py` — the FP8 cache's accuracy on the real model, on a CPU (`python -m course bench step06
  --workload fp8`, registered by benchmarks/step06/bench.py);
- `speculative.py` — the cost of a verify step against a decode step (`python -m benchmarks.step06.speculative`);
- `flashinfer_anchor.py` — the kernels beside FlashInfer on the same tensors (needs FlashInfer's wheels);
- `*_report.py` — the JSON of each turned into the lesson's tables, on any machine;
- `common.py` — what they share: timing, the card's ceilings, random models of the course's shapes.
Importing them needs no GPU; running them does, but for `fp8_accuracy.py`.
"""
