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

# Two tiers (README, "Tests"): `make test` is the default tier (every behaviour, one real end-to-end run each);
# `make test-slow` the wide sweeps (8-rank exactness, every variant of the real detection runs, browser screenshots
# of every fixture, network namespaces, the GPU check's dry run). CI (.ci/run) runs both.
# The default tier spreads its tests over the machine's cores (pytest-xdist; at most 4 workers, each test's ranks
# are processes), and a failed test runs once more before it counts: a test that compares measured times can lose
# its margin to the other worker's load (a real defect fails both times; the summary lists what passed on its rerun).
# The slow tier runs one test at a time: its measured checks (predicted against measured speedups, the random
# matrix of user rings) compare timings that a second worker's load would distort; like the default tier, a failed
# test runs once more before it counts (a detection that a busy machine's noise hid is judged again; a real defect
# fails both times).
test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -m "not slow" -n auto --maxprocesses 4 --reruns 1

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow --reruns 1

test-all: test test-slow

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean-results:
	find results reports -mindepth 1 ! -name README.md -exec rm -rf {} +

# The GPU check's bundle (README, "GPU check"): ringbench's wheel and the wheels a bare GPU machine lacks (never
# torch, triton or numpy), with a manifest, at most 64 MiB. Made where a registry is reached, for the GPU machine's
# CPython: `make gpu-bundle BUNDLE_PY=3.12` for the lent H100 / H200. Then, there:
# bash benchmarks/gpu_check.sh --bundle $(BUNDLE)
BUNDLE    ?= dist/gpu-bundle
BUNDLE_PY ?= $(shell $(PYTHON) -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')

gpu-bundle: $(STAMP)
	$(PY) benchmarks/gpu_bundle.py $(BUNDLE) --python-version $(BUNDLE_PY)
