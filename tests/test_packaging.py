"""`kernels/` installs as `ringbench.kernels`, never as a top-level `kernels` module (PyPI has an unrelated one)."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_editable_install_maps_kernels_under_ringbench(tmp_path):
    # From another folder, so that the checkout itself is not on sys.path.
    probe = (
        "import importlib.util, ringbench.kernels as k; print(k.__file__); print(importlib.util.find_spec('kernels'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    file_line, spec_line = out.stdout.strip().splitlines()[-2:]
    assert Path(file_line).resolve().parent == ROOT / "kernels" and spec_line == "None"


def test_wheel_ships_ringbench_kernels_and_no_top_level_kernels(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if build.returncode != 0:
        pytest.skip(f"could not build a wheel here (no build backend reachable?): {build.stderr.strip()[-300:]}")
    (wheel,) = tmp_path.glob("ringbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ringbench/kernels/__init__.py" in names and "ringbench/kernels/torch_sdpa.py" in names
    assert "ringbench/scenarios/default.yaml" in names
    assert not [n for n in names if n.startswith("kernels/")]
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import sys, importlib.util; sys.path = [p for p in sys.path if 'ringbench' not in p.lower()];"
        f"sys.path.insert(0, {str(site)!r}); import ringbench.kernels as k; print(k.__file__);"
        "print(importlib.util.find_spec('kernels'))"
    )
    out = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": ":".join(p for p in sys.path if "site-packages" in p)}, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    file_line, spec_line = out.stdout.strip().splitlines()[-2:]
    assert file_line.startswith(str(site)) and spec_line == "None"
