"""Build the GPU check's bundle: the wheels a bare GPU machine lacks, and a manifest (``make gpu-bundle``).

    python benchmarks/gpu_bundle.py dist/gpu-bundle                      # for this machine's Python
    python benchmarks/gpu_bundle.py dist/gpu-bundle --python-version 3.12   # for the lent H100 / H200 (3.12)

Run where a package registry is reached. The folder holds ringbench's own wheel (``kernels/`` and ``scenarios/``
installed as ``ringbench.kernels`` and ``ringbench.scenarios``, which only an install makes importable) and the
wheels of benchmarks/gpu_bundle.txt with their dependencies, for one CPython version on manylinux x86-64; never
torch, triton or numpy (the GPU machine's own builds must be the ones imported). ``manifest.json`` lists every
wheel with its size and sha256, what the bundle expects the machine to have, what it leaves out and why, and the
commit it was built from. At most ``--limit-mib`` (64 MiB: what travels to a lent GPU machine with the tree); over
it, one line names the largest wheels and the exit code is 2.

``bash benchmarks/gpu_check.sh --bundle DIR`` installs from it with no index (benchmarks/gpu_env.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpu_env import file_sha256  # the check verifies the bundle with the same digest

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "benchmarks" / "gpu_bundle.txt"
MANIFEST = "manifest.json"
FORMAT = 1
# The machine's own: its CUDA builds (and the numpy they were built against) must be imported, never a carried one.
SYSTEM = ("torch", "triton", "numpy")
NEVER = re.compile(r"^(torch|triton|numpy|nvidia[-_].*|cuda[-_].*)$")
LEFT_OUT = {
    "matplotlib": "figures of `ringbench report`; the check draws none (about 10 MB with pillow and fonttools)",
    "scipy": "the significance test of `ringbench compare`; the check compares nothing (about 35 MB)",
}
# manylinux tags pip must be told one by one (pip matches N of manylinux_2_N exactly).
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")  # fmt: skip


class BundleError(Exception):
    """A bundle that cannot be made: one line, exit code 2."""


def requirements(path: Path = REQUIREMENTS) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def dist_name(wheel: str) -> tuple[str, str]:
    """(normalised distribution name, version) of a wheel file name (PEP 427: name-version-...)."""
    name, version = Path(wheel).name.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise BundleError(f"pip {args[0]} failed: {tail[0][:300]}")


def _commit() -> tuple[str, bool]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return git("rev-parse", "HEAD") or "unknown", bool(git("status", "--porcelain", "--untracked-files=no"))


def fetch(folder: Path, python_version: str) -> None:
    """ringbench's wheel and the requirements' wheels (with their dependencies) for that CPython, into ``folder``."""
    _pip("wheel", "--no-deps", "--quiet", "-w", str(folder), str(ROOT))
    platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    _pip("download", "--quiet", "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version,
         *platforms, "-d", str(folder), *requirements())  # fmt: skip


def select(folder: Path) -> list[Path]:
    """The wheels to ship: never the machine's own (torch, triton, numpy, CUDA libraries); one version each."""
    chosen: dict[str, Path] = {}
    for wheel in sorted(folder.glob("*.whl")):
        name, _ = dist_name(wheel.name)
        if NEVER.match(name):
            continue
        if name in chosen:
            raise BundleError(f"two versions of {name} were fetched ({chosen[name].name}, {wheel.name}); pin one in "
                              f"{REQUIREMENTS.relative_to(ROOT)}")  # fmt: skip
        chosen[name] = wheel
    if "ringbench" not in chosen:
        raise BundleError("pip built no ringbench wheel")
    return list(chosen.values())


def manifest(wheels: list[Path], python_version: str, limit: int) -> dict:
    commit, dirty = _commit()
    top = {re.sub(r"[-_.]+", "-", re.split(r"[<>=!~; ]", r, maxsplit=1)[0]).lower(): r for r in requirements()}
    rows = []
    for wheel in wheels:
        name, version = dist_name(wheel.name)
        rows.append({"file": wheel.name, "name": name, "version": version, "bytes": wheel.stat().st_size,
                     "sha256": file_sha256(wheel), "requirement": top.get(name, ""),
                     "binary": not wheel.name.endswith("-none-any.whl")})  # fmt: skip
    version = dist_name(next(w.name for w in wheels if w.name.startswith("ringbench-")))[1]
    return {
        "format": FORMAT,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ringbench": {"version": version, "commit": commit, "dirty": dirty},
        "python_version": python_version,
        "platforms": list(PLATFORMS),
        "expects_from_the_machine": list(SYSTEM),
        "left_out": LEFT_OUT,
        "wheels": rows,
        "total_bytes": sum(row["bytes"] for row in rows),
        "limit_bytes": limit,
    }


def build(out: Path, python_version: str, limit_mib: float) -> dict:
    limit = int(limit_mib * 2**20)
    if out.exists() and any(p.name != MANIFEST and p.suffix != ".whl" for p in out.iterdir()):
        raise BundleError(f"{out} holds files that are not a bundle's; expected an empty folder or an old bundle")
    with tempfile.TemporaryDirectory(prefix="ringbench-bundle-") as tmp:
        fetch(Path(tmp), python_version)
        wheels = select(Path(tmp))
        total = sum(w.stat().st_size for w in wheels)
        if total > limit:
            largest = ", ".join(f"{w.name.split('-')[0]} {w.stat().st_size / 2**20:.1f} MiB"
                                for w in sorted(wheels, key=lambda w: -w.stat().st_size)[:3])  # fmt: skip
            raise BundleError(f"the bundle would be {total / 2**20:.1f} MiB, over its {limit_mib:g} MiB (largest: "
                              f"{largest}); pin smaller versions in {REQUIREMENTS.relative_to(ROOT)}")  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*.whl"):
            old.unlink()
        for wheel in wheels:
            shutil.copy2(wheel, out / wheel.name)
    document = manifest(sorted(out.glob("*.whl")), python_version, limit)
    (out / MANIFEST).write_text(json.dumps(document, indent=2) + "\n")
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the bundle's folder (made, or an old bundle replaced)")
    parser.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                        help="the GPU machine's CPython, e.g. 3.12 (default: this interpreter's)")  # fmt: skip
    parser.add_argument("--limit-mib", type=float, default=64.0, help="the most the folder may hold")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        print(f"gpu-bundle: --python-version {args.python_version!r} is not allowed; expected 3.N", file=sys.stderr)
        return 2
    try:
        document = build(args.out, args.python_version, args.limit_mib)
    except BundleError as exc:
        print(f"gpu-bundle: {exc}", file=sys.stderr)
        return 2
    wheels = document["wheels"]
    print(f"gpu-bundle: {len(wheels)} wheels, {document['total_bytes'] / 2**20:.1f} MiB of "
          f"{args.limit_mib:g} MiB, for CPython {args.python_version} on manylinux x86-64 (ringbench "
          f"{document['ringbench']['commit'][:10]}{' +local changes' if document['ringbench']['dirty'] else ''}) "
          f"in {args.out}; on the GPU machine: bash benchmarks/gpu_check.sh --bundle {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
