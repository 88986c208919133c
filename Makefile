# The two commands a newcomer runs: `make bench` (the main job) and `make test` (the fast tier).
# Each creates .venv itself on first use; torch is pinned by constraints.txt and installed first,
# because any other torch version pulls a multi-GB CUDA build. Only the targets that say so
# install anything outside the clone (apt, as root): services, corpus and bench-peers.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
BENCH_STAMP := $(VENV)/.installed-bench
PEERS_STAMP := $(VENV)/.installed-peers
# The bench keeps its data and every cache (pip's, matplotlib's, the generated photos) in the
# clone's .cache/, so it changes nothing outside the clone.
BENCH_ENV := XDG_CACHE_HOME=$(CURDIR)/.cache MPLCONFIGDIR=$(CURDIR)/.cache/matplotlib \
	KERAS_HOME=$(CURDIR)/.cache/keras DRAPPS_DATA_DIR=$(CURDIR)/.cache/drapps

.PHONY: bench bench-peers bench-scale-out corpus ffmpeg services test test-integration \
	test-slow test-all lint core clean gpu-wheels gpu-check

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(BENCH_ENV) $(PY) -m pip install -q --upgrade pip
	$(BENCH_ENV) $(PY) -m pip install -q -c constraints.txt torch==2.13.0

# What the fast tier needs (the test extra: the core, image, cache and text, the test tools).
# The region decoder (a C extension, drapps.ops._jpeg_region, declared in setup.py) is compiled by
# these installs against the system's libjpeg-turbo; without a compiler or its headers the install
# goes on without it.
JPEG_EXT := src/drapps/ops/_jpeg_region.c
$(TEST_STAMP): pyproject.toml setup.py constraints.txt $(JPEG_EXT) | $(PY)
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $(TEST_STAMP)

# Everything the heavier tiers need (the dev extra: every peer and engine).
$(STAMP): pyproject.toml setup.py constraints.txt $(JPEG_EXT) | $(PY)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP) $(TEST_STAMP)

# What `make bench` needs, and no more: the image workload, plots, tf.data.
$(BENCH_STAMP): pyproject.toml setup.py constraints.txt $(JPEG_EXT) | $(PY)
	$(BENCH_ENV) $(PY) -m pip install -q -c constraints.txt -e '.[bench,tf]'
	touch $(BENCH_STAMP)

$(PEERS_STAMP): $(BENCH_STAMP)
	$(BENCH_ENV) $(PY) -m pip install -q -c constraints.txt -e '.[bench,tf,peers]'
	touch $(PEERS_STAMP)

# The text workload's corpus (Debian's python3.11-doc); skipped with a note where apt is not ours.
CORPUS := /usr/share/doc/python3.11/html/_sources
corpus:
	@test -d $(CORPUS) || (apt-get update -q && apt-get install -y -q python3.11-doc) \
	  || echo "note: could not install python3.11-doc; the text workload needs it (or DRAPPS_TEXT_CORPUS)"

# The real engines the integration tests start themselves: redis-server, and iproute2 for the
# loopback-only network namespace Ray runs in. Skipped with a note where apt is not ours.
services: ffmpeg
	@command -v redis-server >/dev/null && command -v ip >/dev/null || \
	  (apt-get update -q && apt-get install -y -q redis-server iproute2) || \
	  echo "note: could not install redis-server/iproute2; the Redis and Ray tests will skip"

# FFmpeg's libraries, which the SPDL peer decodes with.
FFMPEG_LIBS := libavformat59 libavcodec59 libavfilter8 libavutil57 libswscale6 libswresample4 libavdevice59
ffmpeg:
	@ldconfig -p | grep -q libavfilter.so.8 || \
	  (echo "installing FFmpeg's libraries with apt (for the SPDL peer)" && \
	   apt-get update -q && apt-get install -y -q $(FFMPEG_LIBS)) || \
	  echo "note: could not install FFmpeg's libraries; the spdl bench system will skip"

# The main job: drapps against DataLoader at 1x-2x the cores and tf.data, steady and under a CPU
# hog, ending in a verdict; installs into .venv only.
bench: $(BENCH_STAMP)
	$(BENCH_ENV) $(VENV)/bin/drapps bench --quick --out bench-results/quick
	$(BENCH_ENV) $(VENV)/bin/drapps bench-plot bench-results/quick/results.json

# The same with DALI, SPDL and torchdata.nodes beside them; installs FFmpeg's libraries with apt.
bench-peers: $(PEERS_STAMP) ffmpeg
	$(BENCH_ENV) $(VENV)/bin/drapps bench --quick --out bench-results/quick-peers --budget 400 \
	  --systems dataloader,tf-autotune,drapps-heuristic,dali-cpu,spdl,torchdata-nodes
	$(BENCH_ENV) $(VENV)/bin/drapps bench-plot bench-results/quick-peers/results.json

# The Ray and Redis paths against the local loader (README, "Scale-out"); Ray runs in a
# loopback-only network namespace made here and removed after.
bench-scale-out: $(STAMP) services
	-ip netns delete drapps-bench 2>/dev/null
	ip netns add drapps-bench && ip netns exec drapps-bench ip link set lo up
	ip netns exec drapps-bench env RAY_AUTH_MODE=disabled $(VENV)/bin/drapps bench-scale-out \
	  --out bench-results/scale-out; status=$$?; ip netns delete drapps-bench; exit $$status

lint: $(TEST_STAMP)
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

# The fast tier: lint, types, doctests and the unit tests, in the test extra's environment.
test: lint
	$(VENV)/bin/pytest -q --doctest-modules src/drapps
	$(VENV)/bin/pytest -q

# Tests that start real engines and interpreters (Redis, a Ray cluster, torchrun, TensorFlow,
# the command line) or need the heavier extras (scikit-image's photos, DALI); and the
# no-extras install that imports every module.
test-integration: $(STAMP) core services
	$(VENV)/bin/pytest -q -m "(integration or extras) and not slow"

# Tests whose duration is the machine's speed (training runs, bench runs, the soak, the
# differential campaigns, which have DIFF_BUDGET_S seconds each, 0: no limit).
SOAK_S ?= 150
DIFF_BUDGET_S ?= 180
# A campaign's state machines write their case and steps to DIFF_TRAIL as they run; if the
# tier fails (a crash in native code kills the test process), the last of it is printed.
DIFF_TRAIL ?= .diff-trail
test-slow: $(STAMP) services
	DRAPPS_SOAK_S=$(SOAK_S) DRAPPS_DIFF_BUDGET_S=$(DIFF_BUDGET_S) DRAPPS_DIFF_TRAIL=$(DIFF_TRAIL) \
	  $(VENV)/bin/pytest -q -m slow --durations=12 \
	  || { code=$$?; echo "the campaigns' last case and steps ($(DIFF_TRAIL)):"; \
	       tail -n 40 $(DIFF_TRAIL) 2>/dev/null; exit $$code; }

# Every tier, as CI runs it.
test-all: test test-integration test-slow

# A lent GPU machine has PyTorch, torchvision and NVML but no package index. Here, with one:
# `make gpu-wheels` puts the wheels it lacks (Python 3.12) in .whl/. There, with .whl carried, one
# part per command (each well under 10 minutes): `make gpu-check-env`, `-tests`, `-none`,
# `-model` (or `make gpu-check` for all four). Results: $(GPU_OUT)/gpu-<name>/ (docs/device.md).
GPU_OUT ?= docs/results
GPU_SITE := /tmp/drapps-site
GPU_WHEELS := simplejpeg==1.9.0
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)

gpu-check-%:
	@if ls .whl/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps \
	  --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl; fi
	PYTHONPATH=$(CURDIR)/src:$(GPU_SITE) python3 -m drapps.bench.gpu_check $* $(GPU_OUT)

gpu-check: gpu-check-env gpu-check-tests gpu-check-none gpu-check-model

clean:
	rm -rf $(VENV) $(CORE) .pytest_cache .mypy_cache .ruff_cache
