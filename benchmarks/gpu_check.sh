#!/usr/bin/env bash
# The one-GPU check: bash benchmarks/gpu_check.sh [--dry-run] [OUT_DIR]   (what it checks: benchmarks/gpu_check.py)
# Without a GPU (or with --dry-run) it runs the same checks on CPU stand-ins and exits 0 when they pass; CI runs it
# that way through the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" benchmarks/gpu_check.py "$@"
