# The two commands a newcomer runs: `make bench` (the main job) and `make test`.
# Each creates .venv itself on first use; torch is pinned by constraints.txt and installed first,
# because any other torch version pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: bench bench-scale-out corpus services test test-slow lint core clean

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

# The real engines the scale-out tests start themselves: redis-server, and iproute2 for the
# loopback-only network namespace Ray runs in; and FFmpeg's libraries, which the SPDL peer in
# the bench decodes with. Skipped with a note where apt is not ours.
FFMPEG_LIBS := libavformat59 libavcodec59 libavfilter8 libavutil57 libswscale6 libswresample4 libavdevice59
services:
	@command -v redis-server >/dev/null && command -v ip >/dev/null || \
	  (apt-get update -q && apt-get install -y -q redis-server iproute2) || \
	  echo "note: could not install redis-server/iproute2; the Redis and Ray tests will skip"
	@ldconfig -p | grep -q libavfilter.so.8 || \
	  (apt-get update -q && apt-get install -y -q $(FFMPEG_LIBS)) || \
	  echo "note: could not install FFmpeg's libraries; the spdl bench system will skip"

bench: $(STAMP) corpus services
	$(VENV)/bin/drapps bench --quick --out bench-results/quick
	$(VENV)/bin/drapps bench-plot bench-results/quick/results.json

# The Ray and Redis paths against the local loader (README, "Scale-out"); Ray runs in a
# loopback-only network namespace made here and removed after.
bench-scale-out: $(STAMP) services
	-ip netns delete drapps-bench 2>/dev/null
	ip netns add drapps-bench && ip netns exec drapps-bench ip link set lo up
	ip netns exec drapps-bench env RAY_AUTH_MODE=disabled $(VENV)/bin/drapps bench-scale-out \
	  --out bench-results/scale-out; status=$$?; ip netns delete drapps-bench; exit $$status

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

test: lint core services
	$(VENV)/bin/pytest -q --doctest-modules src/drapps
	$(VENV)/bin/pytest -q

# Tests whose duration is the machine's speed (training runs, the soak), kept out of `make test`.
test-slow: $(STAMP) services
	$(VENV)/bin/pytest -q -m slow

clean:
	rm -rf $(VENV) $(CORE) .pytest_cache .mypy_cache .ruff_cache
