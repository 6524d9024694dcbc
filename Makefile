# One-command set-up and run on a fresh machine. `make run` and `make test` create .venv when missing, install
# the CPU build of torch 2.13.0 first (so no CUDA build is pulled), then ringbench with its test extras.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ringbench-installed

.PHONY: run test test-slow test-all lint clean-results setup gpu-bundle

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/ringbench run

# Two tiers (README, "Tests"; docs/architecture.md, "Tests"): `make test` is the default tier (every behaviour, one
# real end-to-end run each); `make test-slow` the wide sweeps (8-rank exactness, every variant of the real detection
# runs, browser screenshots of every fixture, network namespaces, the GPU check's dry run). CI (.ci/run) runs both.
# The default tier spreads its tests over the machine's cores (pytest-xdist; at most 4 workers, each test's ranks
# are processes) and reruns nothing: a test that fails there is a defect or a flaky test to fix. A test whose
# assertion is a margin between measured times, which another worker's load can erase, is marked `timing` with its
# reason and runs in the slow tier instead, one test at a time; there, and only for `timing` tests (tests/conftest.py),
# a failure runs once more before it counts (a busy machine's noise hides a margin once; a real defect fails twice).
test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -m "not slow and not timing" -n auto --maxprocesses 4

test-slow: $(STAMP)
	$(PY) -m pytest -q -m "slow or timing"

test-all: test test-slow

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean-results:
	find results reports -mindepth 1 ! -name README.md -exec rm -rf {} +

# The GPU check's bundle (docs/gpu-check.md, "On a bare GPU machine"): ringbench's wheel and the wheels a bare GPU
# machine lacks (never torch, triton or numpy), with a manifest, at most 64 MiB. Made where a registry is reached, for the GPU machine's
# CPython: `make gpu-bundle BUNDLE_PY=3.12` for the lent H100 / H200. Then, there:
# bash benchmarks/gpu_check.sh --bundle $(BUNDLE)
BUNDLE    ?= dist/gpu-bundle
BUNDLE_PY ?= $(shell $(PYTHON) -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')

gpu-bundle: $(STAMP)
	$(PY) benchmarks/gpu_bundle.py $(BUNDLE) --python-version $(BUNDLE_PY)
