"""Rules of the house that the import contracts (pyproject.toml, `lint-imports`) cannot see.

kernels/ installs as ringbench.kernels from outside the package folder, so the contracts' graph does not hold it:
its rule -- kernels know nothing of rings, runs or records -- is checked here from the source. And only one module
reads the launch environment (RANK, WORLD_SIZE, LOCAL_RANK) and chooses the backend and device.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL_MAY_IMPORT = ("ringbench.kernels", "ringbench.errors", "ringbench.spin")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_kernels_know_nothing_of_rings():
    for path in sorted((ROOT / "kernels").glob("*.py")):
        ours = {name for name in _imports(path) if name.startswith("ringbench")}
        stray = {name for name in ours if not name.startswith(KERNEL_MAY_IMPORT)}
        assert not stray, f"{path.name} imports {sorted(stray)}; kernels may import only {KERNEL_MAY_IMPORT}"


def test_one_module_reads_the_launch_environment():
    readers = []
    for path in sorted((ROOT / "ringbench").rglob("*.py")):
        text = path.read_text()
        if any(pattern.format(name) in text for name in ("WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID") for pattern in (
                'environ["{}"]', 'environ.get("{}"', '"{}" in os.environ')):  # fmt: skip
            readers.append(path.relative_to(ROOT).as_posix())
    assert readers == ["ringbench/dist.py"], readers
