"""Chapter 6's measurements on a GPU, apart from the teaching code: each module checks what it times against a
reference, then writes JSON under step06_triton/results/ that report.py turns into the lesson's tables.

- `kernels.py` — the kernels against what a user would pick instead (`python -m step06_triton.measure.kernels`);
- `engine.py` — the engine end to end against Hugging Face `generate`, and where a step's time goes
  (`python -m step06_triton.measure.engine`);
- `cascade.py` — cascade attention: one layer's decode attention, and the engine, with and without it
  (`python -m step06_triton.measure.cascade`);
- `common.py` — what they share: timing, the card's ceilings, random models of the course's shapes.
Importing them needs no GPU; running them does.
"""
