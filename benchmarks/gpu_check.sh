#!/usr/bin/env bash
# The GPU check: bash benchmarks/gpu_check.sh [--bundle DIR] [--dry-run] [--gpus N] [--budget S] [OUT_DIR]
# What it checks and how: benchmarks/gpu_check.py. On one GPU it ends within its budget (7 minutes, a cold Triton
# cache included); without a GPU it refuses in one line (exit 2) unless --dry-run, which runs every check's code on
# CPU stand-ins (CI runs it through the test suite).
#
# --bundle DIR (made by `make gpu-bundle` where a registry is reached): installs ringbench and what the machine
# lacks from DIR with no index, into a venv that sees the machine's torch and triton (benchmarks/gpu_env.py;
# RINGBENCH_GPU_VENV says where, default $TMPDIR/ringbench-gpu-venv), then checks the imports, and only then the
# GPU. Without it the interpreter is $PYTHON, else .venv/bin/python, else python3; when it cannot import what the
# check needs, one line names what is missing and how to make the bundle (exit 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) [ $# -ge 2 ] || { echo "gpu_check: --bundle needs a folder (made by make gpu-bundle)" >&2; exit 2; }
              bundle="$2"; shift 2 ;;
    --bundle=*) bundle="${1#--bundle=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -n "$bundle" ]; then
  [ -d "$bundle" ] || { echo "gpu_check: --bundle $bundle is not a folder; expected one made by make gpu-bundle" >&2; exit 2; }
  base="${PYTHON:-python3}"
  venv="${RINGBENCH_GPU_VENV:-${TMPDIR:-/tmp}/ringbench-gpu-venv}"
  "$base" benchmarks/gpu_env.py install "$bundle" "$venv"
  PY="$venv/bin/python"
else
  PY="${PYTHON:-.venv/bin/python}"
  [ -x "$PY" ] || command -v "$PY" >/dev/null 2>&1 || PY=python3
fi
"$PY" benchmarks/gpu_env.py check
exec "$PY" benchmarks/gpu_check.py "${args[@]+"${args[@]}"}"
