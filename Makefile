# The two commands a newcomer runs: `make bench` (the main job) and `make test`.
# Each creates .venv itself on first use; torch is pinned by constraints.txt and installed first,
# because any other torch version pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: bench corpus test lint core clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The text workload's corpus (Debian's python3.11-doc); skipped with a note where apt is not ours.
CORPUS := /usr/share/doc/python3.11/html/_sources
corpus:
	@test -d $(CORPUS) || (apt-get update -q && apt-get install -y -q python3.11-doc) \
	  || echo "note: could not install python3.11-doc; the text workload needs it (or DRAPPS_TEXT_CORPUS)"

bench: $(STAMP) corpus
	$(VENV)/bin/drapps bench --quick --out bench-results/quick
	$(VENV)/bin/drapps bench-plot bench-results/quick/results.json

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests .ci
	$(VENV)/bin/ruff format --check src tests .ci
	$(VENV)/bin/mypy

# The package with no extras: every module imports, or says which extra it needs.
CORE := .venv-core
core:
	test -x $(CORE)/bin/python || $(PYTHON) -m venv $(CORE)
	$(CORE)/bin/python -m pip install -q -c constraints.txt torch==2.13.0
	$(CORE)/bin/python -m pip install -q -c constraints.txt -e .
	$(CORE)/bin/python .ci/import_every_module.py

test: lint core
	$(VENV)/bin/pytest -q --doctest-modules src/drapps
	$(VENV)/bin/pytest -q

clean:
	rm -rf $(VENV) $(CORE) .pytest_cache .mypy_cache .ruff_cache
