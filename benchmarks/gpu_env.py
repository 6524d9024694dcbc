"""What the GPU check needs importable, and its install from a bundle with no index (standard library only: this
runs on a bare machine's python, before anything is installed).

    python benchmarks/gpu_env.py check                  # one line naming what is missing (exit 2), else silent
    python benchmarks/gpu_env.py install BUNDLE VENV     # a venv that sees this python's packages, the bundle in it

``install`` makes VENV (``python -m venv``) and points it at this interpreter's site-packages with a ``.pth`` file,
so that it sees the machine's torch and triton even when this interpreter is itself a venv (whose packages
``--system-site-packages`` would not show); the venv's own site-packages come first. Then it installs, with
``pip --no-index --no-deps``, ringbench's wheel and every wheel of the bundle the machine lacks (a distribution
the machine has at a version the requirement's lower bounds allow is left to the machine: a newer pyarrow than the
bundle's stays, the bundle's upper bound only capped the size of what it carries). Each wheel's sha256 is checked
against the manifest first; a bundle made for another CPython is refused in one line. A venv already made from
the same manifest is reused.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import re
import site
import subprocess
import sys
from pathlib import Path

# module -> what provides it (the line names these).
REQUIRED = {
    "torch": "torch (the machine's own; a bundle never carries it)",
    "numpy": "numpy (the machine's own)",
    "ringbench.kernels": "ringbench (kernels/ and scenarios/ become ringbench.kernels / ringbench.scenarios only "
    "when installed)",
    "ringbench.scenarios": "ringbench",
    "msgspec": "msgspec",
    "pandas": "pandas",
    "pyarrow": "pyarrow",
    "yaml": "pyyaml",
    "typer": "typer",
    "rich": "rich",
}
HOW = "make the bundle where a registry is reached (make gpu-bundle) and run: bash benchmarks/gpu_check.sh --bundle DIR"
STAMP = ".ringbench-bundle"


class EnvError(Exception):
    """One line, exit code 2."""


def missing() -> dict[str, str]:
    """Modules of REQUIRED that do not import here -> why (the exception's first line)."""
    absent = {}
    for module in REQUIRED:
        try:
            importlib.import_module(module)
        except Exception as exc:  # ImportError, or a broken install that raises something else on import
            absent[module] = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
    return absent


def missing_line(absent: dict[str, str]) -> str:
    providers = []
    for module in absent:
        provider = REQUIRED[module]
        if provider not in providers and not any(provider.startswith(p.split(" ")[0]) for p in providers):
            providers.append(provider)
    return (f"gpu_check: cannot import {', '.join(absent)} with {sys.executable} (missing: {'; '.join(providers)}); "
            f"{HOW}")  # fmt: skip


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def allows(requirement: str, version: str) -> bool:
    """Whether ``version`` meets a requirement made of >=, <, == clauses (the bundle's own requirements)."""
    for op, bound in re.findall(r"(>=|<=|==|<|>)\s*([\d.]+)", requirement):
        have, want = _version(version), _version(bound)
        ok = {">=": have >= want, "<=": have <= want, "==": have == want, "<": have < want, ">": have > want}[op]
        if not ok:
            return False
    return True


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(bundle: Path) -> dict:
    path = bundle / "manifest.json"
    if not path.is_file():
        raise EnvError(f"gpu_check: --bundle {bundle} has no manifest.json; expected a folder made by make gpu-bundle")
    document = json.loads(path.read_text())
    ours = f"{sys.version_info.major}.{sys.version_info.minor}"
    if document["python_version"] != ours and any(row["binary"] for row in document["wheels"]):
        raise EnvError(f"gpu_check: the bundle in {bundle} was made for CPython {document['python_version']}, this "
                       f"python is {ours}; make it again with: make gpu-bundle BUNDLE_PY={ours}")  # fmt: skip
    for row in document["wheels"]:
        wheel = bundle / row["file"]
        if not wheel.is_file() or file_sha256(wheel) != row["sha256"]:
            raise EnvError(f"gpu_check: {wheel} is missing or differs from the manifest; make the bundle again")
    return document


def lower_bounds(requirement: str) -> str:
    """The >= / > / == clauses of a requirement: what the machine's own copy must meet. An upper bound in
    gpu_bundle.txt caps the size of the wheel the bundle carries (pyarrow below 20), never the machine's newer one."""
    return ",".join(f"{op}{bound}" for op, bound in re.findall(r"(>=|==|>)\s*([\d.]+)", requirement))


def to_install(document: dict) -> tuple[list[dict], list[str]]:
    """(wheels to install, 'name version' of those the machine already has at a version it may keep)."""
    chosen, kept = [], []
    for row in document["wheels"]:
        try:
            have = importlib.metadata.version(row["name"])
        except importlib.metadata.PackageNotFoundError:
            have = None
        if row["name"] != "ringbench" and have is not None and allows(lower_bounds(row.get("requirement", "")), have):
            kept.append(f"{row['name']} {have}")
        else:
            chosen.append(row)
    return chosen, kept


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise EnvError(f"gpu_check: {what} failed: {tail[0][:300]}")


def make_venv(venv: Path) -> Path:
    """A venv whose python sees this interpreter's packages after its own; returns its python."""
    _run([sys.executable, "-m", "venv", "--clear", "--system-site-packages", str(venv)], f"python -m venv {venv}")
    python = venv / "bin" / "python"
    probe = "import site, sys; print(site.getsitepackages()[0])"
    own = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(own) / "_ringbench_machine.pth").write_text("".join(f"{p}\n" for p in ours))
    return python


def install(bundle: Path, venv: Path) -> str:
    """Install the bundle into ``venv``; returns the line that says what was done."""
    document = read_manifest(bundle)
    stamp = hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()
    python = venv / "bin" / "python"
    built = document["ringbench"]
    made = f"ringbench {built['commit'][:10]}{' +local changes' if built['dirty'] else ''}"
    if (venv / STAMP).is_file() and (venv / STAMP).read_text().strip() == stamp and python.exists():
        return f"gpu_check: reusing {venv} (made from the bundle in {bundle}: {made})"
    chosen, kept = to_install(document)
    python = make_venv(venv)
    _run([str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir", "--quiet",
          "--disable-pip-version-check", *[str(bundle / row["file"]) for row in chosen]],
         f"pip install --no-index from {bundle}")  # fmt: skip
    (venv / STAMP).write_text(stamp + "\n")
    kept_text = f"; the machine's own: {', '.join(kept)}" if kept else ""
    return (f"gpu_check: installed {len(chosen)} of {len(document['wheels'])} wheels from {bundle} into {venv} "
            f"with no index ({made}){kept_text}")  # fmt: skip


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["check"]:
            absent = missing()
            if absent:
                print(missing_line(absent), file=sys.stderr)
                return 2
            return 0
        if argv[:1] == ["install"] and len(argv) == 3:
            print(install(Path(argv[1]), Path(argv[2])), flush=True)
            return 0
    except EnvError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print("usage: gpu_env.py check | install BUNDLE VENV", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
