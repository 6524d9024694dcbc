#!/usr/bin/env bash
# The one-GPU check: bash benchmarks/gpu_check.sh [--dry-run] [--gpus N] [--budget S] [OUT_DIR]
# What it checks and how: benchmarks/gpu_check.py. On one GPU it ends within its budget (7 minutes, a cold Triton
# cache included); without a GPU it refuses in one line (exit 2) unless --dry-run, which runs every check's code on
# CPU stand-ins (CI runs it through the test suite).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" benchmarks/gpu_check.py "$@"
