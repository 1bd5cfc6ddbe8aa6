# Two commands: `make tour` runs every chapter's demo; `make test` runs the whole suite.
# Both create .venv on first use.
PY := .venv/bin/python
CHAPTERS := $(sort $(wildcard step0*_*))

.PHONY: setup tour test test-fast stress bench report notebooks figures lint clean book

.venv/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh

setup: .venv/.installed

tour: .venv/.installed
	@for ch in $(CHAPTERS); do \
	  echo; echo "================ python -m $$ch ================"; \
	  $(PY) -m $$ch || exit 1; \
	done

# Two pytest-xdist workers (one per core of the CI machine): each file runs whole on one worker, so its module
# fixtures run once; tests/conftest.py hands out the longest files first and gives each worker its share of cores.
XDIST ?= -n 2 --dist loadfile --no-loadscope-reorder

# The layers first (pyproject.toml's import-linter contract: command line > benchmarks > chapters > shared plumbing),
# then the attention contract's types (pyproject.toml's [tool.mypy]: the contract and every backend that follows it).
test: .venv/.installed
	.venv/bin/lint-imports --no-cache
	.venv/bin/mypy
	$(PY) -m pytest -q $(XDIST) --nbmake tests notebooks

test-fast: .venv/.installed
	.venv/bin/lint-imports --no-cache
	.venv/bin/mypy
	$(PY) -m pytest -q $(XDIST) -m "not slow" tests

# The stress and fault probe, long (make test runs a short one): 1,300 random requests through each of the 38
# engine combinations (49,400 in all; 6 of them decode speculatively) with aborts, injected forward faults and
# preemption storms, every answer against step01's, invariants after every step; prints its counts, fails on any
# mismatch, leak or broken invariant. Another seed: make stress STRESS_SEED=3.
STRESS_SEED ?= 0
stress: .venv/.installed
	$(PY) -m tests.stress --requests 1300 --seed $(STRESS_SEED)

# Every number in the READMEs: each run writes stepNN_x/results/WORKLOAD.json (figures, machine, date,
# command), then `python -m course report --write` redraws the READMEs' tables and plots from those files.
# About two hours on 2 idle cores (the `long` workload prefills 2k-token prompts with the cache off; the host
# bench and the policy benches repeat their runs; speculative decoding takes about half an hour, the FP8 accuracy
# bench 18 minutes: 60 requests through five pools).
bench: .venv/.installed
	$(PY) -m course bench step01 --save --json | tail -1
	$(PY) -m course bench step02 --workload batch --save --json | tail -1
	$(PY) -m course bench step02 --workload host --save --json | tail -1
	$(PY) -m course bench step05 --workload speculative --repeats 2 --save --json | tail -1
	@for ch in step03 step04 step05; do for w in short long shared_prefix diverge; do \
	  $(PY) -m course bench $$ch --workload $$w --save --json | tail -1 || exit 1; \
	done; done
	$(PY) -m course bench step05 --workload multi_turn --save --json | tail -1
	$(PY) -m course bench step04 --workload multi_doc --save --json | tail -1
	$(PY) -m course bench step05 --workload multi_doc --save --json | tail -1
	$(PY) -m benchmarks.step05.bench --save | tail -1
	$(PY) -m benchmarks.step05.bench --engines --save | tail -1
	$(PY) -m course bench step06 --workload fp8 --save --json | tail -1
	$(PY) -m benchmarks.step07.bench --save | tail -1
	$(PY) -m benchmarks.step07.routing --save | tail -1
	@echo "chapter 6 measures on a GPU: python -m benchmarks.step06.kernels --part kernels --out step06_triton/results/h200.json;"
	@echo "  python -m benchmarks.step06.engine --out step06_triton/results/h200_engine.json; python -m benchmarks.step06.cascade --out step06_triton/results/h200_cascade.json;"
	@echo "  python -m benchmarks.step06.fp8 --out step06_triton/results/h200_fp8.json; python -m benchmarks.step06.speculative --out step06_triton/results/h200_speculative.json;"
	@echo "  python -m benchmarks.step06.compiled --out step06_triton/results/h200_compiled.json (the compiled runner beside the hand-fused one);"
	@echo "  with FlashInfer's wheels (see its docstring): python -m benchmarks.step06.flashinfer_anchor --out step06_triton/results/h200_flashinfer.json"
	$(MAKE) report
	@echo "answer keys quote measured numbers: .venv/bin/python -m pytest -q tests/instructors names each one this run moved"

# Tables and plots of every chapter's README from the committed results/*.json (no benchmark runs).
report: .venv/.installed
	$(PY) -m course report --write

# Re-execute every notebook in place, so that GitHub shows its pictures (commit the result).
notebooks: .venv/.installed
	@for nb in notebooks/*.ipynb; do echo "executing $$nb"; \
	  $(PY) -m jupyter nbconvert --to notebook --execute --inplace "$$nb" || exit 1; \
	done

# Redraw every lesson's pictures from the chapters' own code into stepNN_x/figures/ (commit the result);
# `python -m course figures --check` lists the stale ones, as tests/test_figures.py does.
figures: .venv/.installed
	$(PY) -m course figures

# The course as a website, built into build/book/site from the pages book.yml lists (MkDocs Material, the notebooks
# with their committed outputs); read it with: python -m http.server -d build/book/site --bind 127.0.0.1 8000
book: .venv/.installed
	$(PY) scripts/book.py

lint: .venv/.installed
	.venv/bin/ruff check .

clean:
	rm -rf .pytest_cache .ruff_cache .hypothesis homework
	find . -name __pycache__ -prune -exec rm -rf {} +
