"""The one-GPU check script runs its CPU dry run anywhere and exits 0 (CI runs it this way)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine run the real check: benchmarks/gpu_check.sh")
@pytest.mark.slow
def test_gpu_check_dry_run_passes_without_a_gpu(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env={"PYTHON": sys.executable,
                                                                             "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["dry_run"] and summary["passed"]
    assert [c["check"] for c in summary["checks"]] == ["gpu-tests", "loopback", "timeline", "calibration", "placement"]
    assert "gpu_check summary: 5/5 checks passed" in done.stdout
