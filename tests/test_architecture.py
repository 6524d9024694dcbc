"""Rules of the house that the import contracts (pyproject.toml, `lint-imports`) cannot see.

kernels/ installs as ringbench.kernels from outside the package folder, so the contracts' graph does not hold it:
its rule -- kernels know nothing of rings, runs or records -- is checked here from the source. And only one module
reads the launch environment (RANK, WORLD_SIZE, LOCAL_RANK) and chooses the backend and device.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL_MAY_IMPORT = ("ringbench.kernels", "ringbench.errors", "ringbench.kernels.spin")


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
    assert readers == ["ringbench/rank/dist.py"], readers


def _map():
    import importlib.util

    spec = importlib.util.spec_from_file_location("architecture_map", ROOT / "docs" / "architecture_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_package_has_a_floor_and_says_what_it_owns():
    house = _map()
    placed = {name for floor in house.floors() for name in floor}
    missing = [name for name in house.packages() if name not in placed]
    assert not missing, f"packages without a floor in pyproject.toml's layers contract: {missing}"
    for name in house.packages():
        doc = ast.get_docstring(ast.parse((ROOT / "ringbench" / name / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"ringbench/{name}/__init__.py opens with no docstring of what it owns"


def test_at_most_eight_modules_stand_at_the_top_level():
    top = sorted(p.name for p in (ROOT / "ringbench").glob("*.py"))
    assert len(top) <= 8, top


def test_the_map_shows_every_package():
    svg = (ROOT / "docs" / "architecture.svg").read_text()
    house = _map()
    absent = [name for name in house.packages() if f">{name}</text>" not in svg]
    assert not absent, f"docs/architecture.svg lacks {absent}: run python docs/architecture_map.py"


def _module_graph() -> dict[str, set[str]]:
    """ringbench module -> the ringbench modules it imports (lazy imports included; kernels/ as ringbench.kernels)."""
    files = {}
    for path in (ROOT / "ringbench").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in (ROOT / "kernels").glob("*.py"):
        files["ringbench.kernels" + ("" if path.stem == "__init__" else f".{path.stem}")] = path
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                candidates = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            for candidate in candidates:
                if candidate in files and candidate != name:
                    targets.add(candidate)
                    break
        graph[name] = targets
    return graph


def test_no_import_circles():
    """No two modules import each other, directly or round about (the report's model and its sections: one way)."""
    graph, state, circles = _module_graph(), {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if target == "ringbench" or target.startswith("ringbench.__"):
                continue  # the package's face re-exports; its importers are outside the circle question
            if state.get(target) == "open":
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, "import circles:\n" + "\n".join(circles)


MAX_FUNCTION_LINES = 80


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def test_no_function_is_longer_than_80_lines():
    """A long function is usually several steps that want names; one that must stay whole says why in its
    docstring, on a line that starts "Long because" (benchmarks/ is outside this rule)."""
    long = []
    for path in sorted([*(ROOT / "ringbench").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]):
        where = path.relative_to(ROOT).as_posix()
        for name, node in _functions(ast.parse(path.read_text())):
            lines = node.end_lineno - node.lineno + 1
            if lines <= MAX_FUNCTION_LINES:
                continue
            doc = ast.get_docstring(node) or ""
            if not any(line.lstrip().startswith("Long because") for line in doc.splitlines()):
                long.append(f"{where}:{node.lineno} {name} ({lines} lines)")
    assert not long, (
        f"functions over {MAX_FUNCTION_LINES} lines (split them, or say why in a docstring line 'Long because ...'):\n"
        + "\n".join(long)
    )


# Module stems that name one meaning in more than one place, each explained in docs/architecture.md ("One name per
# concept"): two packages' central type or interface, or a section that mirrors the analysis it renders.
SHARED_STEMS = {"model", "base", "hops_on_topology"}
# Module stems equal to a package's name, where the module is about that package: the implementations' names (the
# ``impl`` axis) beside the implementations themselves, and the analysis of a conformance check's rows.
STEMS_NAMING_THEIR_PACKAGE = {"impls": "scenario/impls.py", "conformance": "analysis/conformance.py"}


# simulate/engine.py becomes simulate/phase_ring.py in the change that gives the predict wing its door; until then
# its stem is the engine package's name.
def _modules() -> list[Path]:
    return [path for path in [*(ROOT / "ringbench").rglob("*.py"), *(ROOT / "kernels").glob("*.py")]
            if path.stem != "__init__"]  # fmt: skip


def test_one_name_per_concept():
    """A module stem names one thing: it occurs in one package only (but for the shared names explained in
    docs/architecture.md), and it is no other package's name (``report/figures.py`` beside the ``figures``
    package was two meanings of one word); a module may carry the name of a package it lives in."""
    from collections import defaultdict

    packages: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        packages[path.stem].append(path.relative_to(ROOT).as_posix())
    shared = {stem: paths for stem, paths in packages.items() if len(paths) > 1}
    assert set(shared) <= SHARED_STEMS, f"module names in several packages (rename, or explain and allow): {shared}"
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for stem in shared:
        assert f"`{stem}.py`" in doc, f"docs/architecture.md does not say why {stem}.py occurs twice"

    package_names = {path.parent.name for path in (ROOT / "ringbench").rglob("__init__.py")} | {"kernels"}
    clashes = []
    for path in _modules():
        inside = {parent.name for parent in path.relative_to(ROOT).parents}
        allowed = STEMS_NAMING_THEIR_PACKAGE.get(path.stem, "")
        if path.stem in package_names and path.stem not in inside and not (allowed and path.match(allowed)):
            clashes.append(path.relative_to(ROOT).as_posix())
    assert not clashes, f"modules named like another package (rename them): {clashes}"
