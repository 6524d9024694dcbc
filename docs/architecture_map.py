"""Draw docs/architecture.svg: ringbench's packages on their floors, and the imports between them.

The floors come from the layers contract in pyproject.toml (the same list that `lint-imports` checks), the arrows
from the source's own imports (ast, package to package), so the picture cannot drift from the code:
tests/test_architecture.py fails when a package has no floor, and when the picture lacks a package.

    python docs/architecture_map.py            # rewrites docs/architecture.svg
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
VOCABULARY = "vocabulary"  # the top-level modules: errors, vocab, fmt, orders, markers
KERNELS = "kernels"  # kernels/ installs as ringbench.kernels (outside the package folder)


def floors() -> list[list[str]]:
    """The layers contract, top floor first: each floor a list of package names (``ringbench.`` dropped)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] == "layers":
            return [[name.strip().removeprefix("ringbench.") for name in layer.split("|")]
                    for layer in contract["layers"]]  # fmt: skip
    raise SystemExit("pyproject.toml has no layers contract")


def packages() -> list[str]:
    """Every package folder directly under ringbench/ (what must have a floor)."""
    return sorted(p.name for p in (ROOT / "ringbench").iterdir() if (p / "__init__.py").is_file())


def _owner(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "ringbench":
        return None
    if len(parts) == 1:
        return VOCABULARY
    name = parts[1]
    if name == KERNELS:
        return KERNELS
    return name if (ROOT / "ringbench" / name / "__init__.py").is_file() else VOCABULARY


def package_imports() -> dict[str, set[str]]:
    """package -> the other packages its modules import (any import, lazy ones included)."""
    edges: dict[str, set[str]] = defaultdict(set)
    sources = [(p, _owner("ringbench." + p.relative_to(ROOT / "ringbench").parts[0].removesuffix(".py")))
               for p in (ROOT / "ringbench").rglob("*.py")]  # fmt: skip
    sources += [(p, KERNELS) for p in (ROOT / "kernels").glob("*.py")]
    for path, owner in sources:
        if owner is None or (path.parent == ROOT / "ringbench" and path.name in ("__init__.py", "__main__.py")):
            continue  # the package's face (the public API) and its entry point stand above every floor
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                target = _owner(name)
                if target and target != owner:
                    edges[owner].add(target)
    return edges


def draw(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    matplotlib.rcParams["svg.hashsalt"] = "ringbench"  # stable ids: the file changes only when the house does
    matplotlib.rcParams["svg.fonttype"] = "none"  # names stay text (searchable, and the test reads them)
    layers = floors()
    layers = [*layers[:-1], [*layers[-1], KERNELS], [VOCABULARY]]  # kernels stand beside the topology model
    edges = package_imports()
    width, row = 12.0, 0.9
    fig, ax = plt.subplots(figsize=(width, row * len(layers) + 0.8))
    ax.set_xlim(0, width)
    ax.set_ylim(-0.2, row * len(layers) + 0.3)
    ax.axis("off")
    centre, box_w, box_h = {}, 1.9, 0.5
    for level, names in enumerate(layers):
        y = row * (len(layers) - 1 - level) + 0.3
        ax.text(0.1, y, f"floor {len(layers) - 1 - level}", va="center", fontsize=8, color="#666")
        gap = (width - 1.6) / len(names)
        for i, name in enumerate(names):
            x = 1.6 + gap * (i + 0.5)
            centre[name] = (x, y)
            ax.add_patch(FancyBboxPatch((x - box_w / 2, y - box_h / 2), box_w, box_h, boxstyle="round,pad=0.02",
                                        facecolor="#e8f0fb", edgecolor="#3465a4"))  # fmt: skip
            ax.text(x, y, name, ha="center", va="center", fontsize=10)
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            if source not in centre or target not in centre or target == VOCABULARY:  # every floor uses it
                continue
            (x0, y0), (x1, y1) = centre[source], centre[target]
            upward = y1 > y0 + 1e-9
            ax.add_patch(FancyArrowPatch((x0, y0 - box_h / 2), (x1, y1 + box_h / 2), arrowstyle="-|>",
                                         mutation_scale=8, linewidth=0.6, alpha=0.45,
                                         color="#cc0000" if upward else "#555",
                                         connectionstyle="arc3,rad=0.08"))  # fmt: skip
    ax.set_title("ringbench: packages by floor; arrows are imports, always downward (data flows up: "
                 "scenario -> ranks -> record -> analyses -> reports);\nevery floor uses the vocabulary (errors, vocab, fmt, orders, markers)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "architecture.svg"
    draw(out)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
