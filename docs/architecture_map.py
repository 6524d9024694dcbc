"""Draw docs/architecture.svg: ringbench's packages on their floors, and the imports between them.

The floors come from the contracts in pyproject.toml (the same ones that `lint-imports` checks: the base-and-top
layers, the wings' independence and their insides), the wings and the arrows from the source's own imports (ast,
package to package; independent wings share no import), so the picture cannot drift from the code:
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


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _split(layer: str) -> list[str]:
    """A layer's packages (``ringbench.`` dropped): siblings separated by ``|`` (independent) or ``:``."""
    return [name.strip().removeprefix("ringbench.") for name in layer.replace(":", "|").split("|")]


def floors() -> list[list[str]]:
    """The base-and-top layers contract (the first), top floor first: each floor a list of package names."""
    for contract in _contracts():
        if contract["type"] == "layers":
            return [_split(layer) for layer in contract["layers"]]
    raise SystemExit("pyproject.toml has no layers contract")


def wings(edges: dict[str, set[str]]) -> list[list[list[str]]]:
    """The independence contract's packages grouped into wings (the packages that import each other: independent
    wings share no import), each wing as its inside floors, top first (the second layers contract)."""
    independent = next(c for c in _contracts() if c["type"] == "independence")
    names = [name.removeprefix("ringbench.") for name in independent["modules"]]
    inside = [c for c in _contracts() if c["type"] == "layers"][1]
    level = {name: index for index, layer in enumerate(inside["layers"]) for name in _split(layer)}
    groups: list[set[str]] = []
    for name in names:
        joined = [g for g in groups if any(other in edges.get(name, ()) or name in edges.get(other, ()) for other in g)]
        merged = {name}.union(*joined)
        groups = [g for g in groups if g not in joined] + [merged]
    out = []
    for group in sorted(groups, key=lambda g: min(names.index(n) for n in g)):
        depth = max(level[n] for n in group) + 1
        out.append([[n for n in names if n in group and level[n] == d] for d in range(depth)])
        out[-1] = [row for row in out[-1] if row]
    return out


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


WING_NAMES = {"run": "measure", "simulate": "predict", "analysis": "answer"}  # a wing's label, by one member


def _rows(
    edges: dict[str, set[str]],
) -> tuple[list[list[tuple[str, float, float]]], list[tuple[str, float, float, int]]]:
    """Rows of (package, x, box width), top first, and the wings' frames (label, x0, x1, rows they span)."""
    width = WIDTH - LEFT
    groups = wings(edges)
    winged = {name for wing in groups for row in wing for name in row}
    rows, frames = [], []
    for names in floors():
        if set(names) & winged:
            depth = max(len(wing) for wing in groups)
            band = [[] for _ in range(depth)]
            for index, wing in enumerate(groups):
                x0 = LEFT + width * index / len(groups)
                for level, row in enumerate(wing):
                    gap = width / len(groups) / len(row)
                    band[level] += [(name, x0 + gap * (i + 0.5), min(BOX_W, 0.9 * gap)) for i, name in enumerate(row)]
                label = next((WING_NAMES[n] for row in wing for n in row if n in WING_NAMES), "wing")
                frames.append((label, x0 + 0.05, x0 + width / len(groups) - 0.05, depth))
            frames = [(label, x0, x1, len(rows)) for label, x0, x1, _ in frames]
            rows += band
            continue
        if names[0] in ("errors", "vocab"):
            names = [VOCABULARY]  # the top-level modules, drawn as one box
        elif "topology" in names:
            names = [*names, KERNELS]  # kernels stand beside the topology model
        gap = width / len(names)
        rows.append([(name, LEFT + gap * (i + 0.5), min(BOX_W, 0.9 * gap)) for i, name in enumerate(names)])
    return rows, frames


WIDTH, LEFT, ROW, BOX_W, BOX_H = 12.0, 1.6, 0.9, 1.9, 0.5


def draw(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    matplotlib.rcParams["svg.hashsalt"] = "ringbench"  # stable ids: the file changes only when the house does
    matplotlib.rcParams["svg.fonttype"] = "none"  # names stay text (searchable, and the test reads them)
    edges = package_imports()
    rows, frames = _rows(edges)
    fig, ax = plt.subplots(figsize=(WIDTH, ROW * len(rows) + 0.8))
    ax.set_xlim(0, WIDTH)
    ax.set_ylim(-0.2, ROW * len(rows) + 0.3)
    ax.axis("off")

    def y_of(level: int) -> float:
        return ROW * (len(rows) - 1 - level) + 0.3

    for label, x0, x1, first in frames:
        depth = max(len(w) for w in wings(edges))
        top, bottom = y_of(first) + BOX_H / 2 + 0.2, y_of(first + depth - 1) - BOX_H / 2 - 0.08
        ax.add_patch(FancyBboxPatch((x0, bottom), x1 - x0, top - bottom, boxstyle="round,pad=0.02",
                                    facecolor="#f7f3e8", edgecolor="#b08d3a", linestyle="--"))  # fmt: skip
        ax.text(x0 + 0.08, top - 0.03, f"{label} wing", va="top", fontsize=7, color="#8a6d1f")
    centre, width_of = {}, {}
    for level, row in enumerate(rows):
        y = y_of(level)
        ax.text(0.1, y, f"floor {len(rows) - 1 - level}", va="center", fontsize=8, color="#666")
        for name, x, box_w in row:
            centre[name], width_of[name] = (x, y), box_w
            ax.add_patch(FancyBboxPatch((x - box_w / 2, y - BOX_H / 2), box_w, BOX_H, boxstyle="round,pad=0.02",
                                        facecolor="#e8f0fb", edgecolor="#3465a4"))  # fmt: skip
            ax.text(x, y, name, ha="center", va="center", fontsize=10)
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            if source not in centre or target not in centre or target == VOCABULARY:  # every floor uses it
                continue
            (x0, y0), (x1, y1) = centre[source], centre[target]
            upward = y1 > y0 + 1e-9
            ax.add_patch(FancyArrowPatch((x0, y0 - BOX_H / 2), (x1, y1 + BOX_H / 2), arrowstyle="-|>",
                                         mutation_scale=8, linewidth=0.6, alpha=0.45,
                                         color="#cc0000" if upward else "#555",
                                         connectionstyle="arc3,rad=0.08"))  # fmt: skip
    ax.set_title("ringbench: one base, three wings that never import each other, the commands on top; arrows are "
                 "imports, always downward\n(data flows up: scenario -> ranks -> record -> analyses -> reports); "
                 "every floor uses the vocabulary (errors, vocab, fmt, orders, markers)", fontsize=9)  # fmt: skip
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
