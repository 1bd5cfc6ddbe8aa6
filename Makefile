# Two commands: `make tour` runs every chapter's demo; `make test` runs the whole suite.
# Both create .venv on first use.
PY := .venv/bin/python
CHAPTERS := $(sort $(wildcard step0*_*))

.PHONY: setup tour test test-fast lint clean

.venv/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh

setup: .venv/.installed

tour: .venv/.installed
	@for ch in $(CHAPTERS); do \
	  echo; echo "================ python -m $$ch ================"; \
	  $(PY) -m $$ch || exit 1; \
	done

test: .venv/.installed
	$(PY) -m pytest -q --nbmake tests notebooks

test-fast: .venv/.installed
	$(PY) -m pytest -q -m "not slow" tests

lint: .venv/.installed
	.venv/bin/ruff check .

clean:
	rm -rf .pytest_cache .ruff_cache .hypothesis homework
	find . -name __pycache__ -prune -exec rm -rf {} +
