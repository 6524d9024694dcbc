"""One workload model: every model that carries a case's axes is a Workload or wraps one, held against the axis
registry (ringbench/scenario/axes.py); one function writes a cases-table row's axes (ringbench/record/rows.py)."""

import ast
import dataclasses
from pathlib import Path

import pytest

from ringbench.errors import UsageError
from ringbench.record.rows import case_row
from ringbench.record.schema import CASE_AXES
from ringbench.scenario.axes import AXIS_NAMES
from ringbench.scenario.scenario import DEFAULT_SCENARIO, Case
from ringbench.scenario.workload import WORKLOAD_FIELDS, Workload

ROOT = Path(__file__).resolve().parent.parent
SHAPE = {"world", "seq", "heads", "head_dim", "batch", "dtype"}
# Models that hold axes without being a workload, and why.
NOT_A_CASE = {
    "Scenario": "a sweep: a list of values per axis, whose cartesian product makes the cases",
    "ShardSpec": "one rank's input tensors in the engine, below the scenario: made from a workload by ShardSpec.of",
}


def _dataclass_fields(path: Path):
    """(class name, {field: annotation text}) of each dataclass in ``path``."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        decorators = [ast.unparse(d) for d in node.decorator_list]
        if not any(d.startswith(("dataclass", "dataclasses.dataclass")) for d in decorators):
            continue
        fields = {item.target.id: ast.unparse(item.annotation) for item in node.body
                  if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}  # fmt: skip
        yield node.name, fields


def test_the_workload_is_the_axis_registry_less_how_it_is_computed():
    assert set(WORKLOAD_FIELDS) == (set(AXIS_NAMES) - {"kernel", "impl"}) | {"kv_heads"}
    assert set(Case(workload=Workload(world=2, seq=64)).axes()) == set(AXIS_NAMES) | {"backward", "kv_heads", "ring"}
    assert set(CASE_AXES) == set(AXIS_NAMES) | {"backward"}


def test_every_model_that_carries_case_axes_is_or_wraps_a_workload():
    carriers, wrappers = [], []
    for path in sorted([*(ROOT / "ringbench").rglob("*.py"), *(ROOT / "tests" / "support").rglob("*.py")]):
        for name, fields in _dataclass_fields(path):
            if fields.get("workload") == "Workload":
                wrappers.append(name)
            elif len(SHAPE & set(fields)) >= 3 and name != "Workload" and name not in NOT_A_CASE:
                carriers.append(f"{path.relative_to(ROOT)}:{name} ({', '.join(sorted(SHAPE & set(fields)))})")
    assert not carriers, f"models with their own case axes (wrap a Workload instead): {carriers}"
    assert {"Case", "SimCase", "PlanRequest", "CheckCase", "SimConfig"} <= set(wrappers), wrappers


@pytest.mark.parametrize("model", ["Case", "SimCase", "PlanRequest", "CheckCase", "SimConfig"])
def test_a_wrapper_reads_the_workloads_axes_as_its_own(model):
    from support.given import SimConfig
    from support.selfcheck import CheckCase

    from ringbench.advise.planner import PlanRequest
    from ringbench.simulate.case import SimCase

    workload = Workload(world=4, seq=256, heads=4, kv_heads=2, head_dim=16, dtype="float32", strategy="hybrid:2",
                        placement="interleaved")  # fmt: skip
    made = {"Case": lambda: Case(workload=workload), "SimCase": lambda: SimCase(workload=workload),
            "PlanRequest": lambda: PlanRequest(workload=workload, topology=Path("t.yaml")),
            "CheckCase": lambda: CheckCase(workload=workload),
            "SimConfig": lambda: SimConfig(workload=workload)}[model]()  # fmt: skip
    assert {name: getattr(made, name) for name in WORKLOAD_FIELDS} == workload.axes()
    assert made.ring == [0, 2, 1, 3] and made.key_value_heads == 2
    with pytest.raises((AttributeError, TypeError)):  # frozen slots classes refuse with either, by Python version
        made.world = 8  # read-only: the workload is the one place the axes live


def test_normalisation_gives_one_spelling_per_computation():
    assert Workload(world=4, seq=64, buffer="allgather").strategy == "allgather"
    ulysses = Workload(world=4, seq=64, heads=4, strategy="ulysses", buffer="double", order="reverse", placement="x")
    assert (ulysses.buffer, ulysses.order, ulysses.placement) == ("sync", "identity", "")
    assert Workload(world=4, seq=64, strategy="hybrid:2", buffer="double-short").buffer == "double"
    assert Workload(world=4, seq=64, strategy="double-ring:2").placement == "heads-first"
    unknown = Workload(world=4, seq=64, mask="unknown", layout="unknown", buffer="unknown")  # an import's
    assert (unknown.buffer, unknown.strategy) == ("unknown", "ring")


def test_case_ids_and_rows_come_from_the_workload():
    case = DEFAULT_SCENARIO.cases()[0]
    assert case.case_id == "w4-s1024-h2x32-b1-float32-causal-contiguous-sync-identity-torch-fb-982eda"
    assert Case.from_axes(**case.axes()) == case
    row = case_row(case, 3, step_ms=1.5)
    assert list(row)[:2] == ["case_id", "repeat"] and row["repeat"] == 3 and row["step_ms"] == 1.5
    assert {name: row[name] for name in CASE_AXES} == {name: case.axes()[name] for name in CASE_AXES}
    assert case_row(case, 0, case_id="mine")["case_id"] == "mine"


@pytest.mark.parametrize(("axes", "named"), [
    (dict(heads=8, kv_heads=3), "kv_heads=3"),
    (dict(heads=8, kv_heads=-1), "kv_heads=-1"),
    (dict(heads=0), "heads=0"),
    (dict(strategy="hybrid:3"), "strategy='hybrid:3'"),
    (dict(dtype="float8"), "dtype='float8'"),
    (dict(mask="causal+bad"), "mask="),
])  # fmt: skip
def test_a_bad_axis_is_named_in_one_line(axes, named):
    with pytest.raises(UsageError) as caught:
        Workload(world=4, seq=64, **axes).checked()
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_grouped_query_attention_is_refused_where_the_engine_has_none():
    from ringbench.rank.impls import get_adapter

    case = Case(workload=Workload(world=4, seq=256, heads=4, kv_heads=2, dtype="float32"))
    with pytest.raises(UsageError, match=r"kv_heads=2 \(K and V of as many heads as the queries' 4\)"):
        get_adapter("torch-ring").check(case, "cpu")
    assert Workload(world=4, seq=256, heads=4, kv_heads=4).checked().key_value_heads == 4  # as many: accepted


def test_a_workload_is_frozen_and_hashable():
    workload = Workload(world=2, seq=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        workload.world = 4
    assert len({workload, Workload(world=2, seq=64)}) == 1
