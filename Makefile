# The two commands a newcomer runs: `make bench` (the main job) and `make test`.
# Each creates .venv itself on first use; torch is pinned by constraints.txt and installed first,
# because any other torch version pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: bench test lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

bench: $(STAMP)
	$(VENV)/bin/drapps bench --quick

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
