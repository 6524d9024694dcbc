"""The plan's predictions beside published measurements (benchmarks/validate_published.py) and beside measured
CPU runs of the masks users train with (benchmarks/validate_plan_masks.py, slow tier).

The published tables are priced with the catalogue's priors only, nothing fitted to them; these tests hold the
verdicts of docs/plan.md so that a change to the model that loses them fails here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def validated():
    validate = _module("validate_published")
    tables = yaml.safe_load((validate.HERE / "tables.yaml").read_text())["tables"]
    return {table["id"]: validate.validate_table(table) for table in tables}


@pytest.mark.parametrize("table", ["magi-h100", "rfa-layouts"])
def test_the_starting_sets_tables_pass(validated, table):
    result = validated[table]
    assert result["passes"], (result["first_choice_within"], result["row_count"], result["pooled_spearman"])


def test_every_table_keeps_its_first_choices_and_order(validated):
    floors = {
        "magi-h100": (16, 0.85),
        "magi-b200": (16, 0.7),
        "rfa-layouts": (4, 0.9),
        "usp-l20-pcie": (2, 0.9),
        "magi-h100-varlen": (10, 0.7),
        "usp-a100-pcie": (1, -0.5),
        "l20-pcie-user": (1, 0.7),
    }  # docs/plan.md's figures, less a margin
    for table, (rows, spearman) in floors.items():
        result = validated[table]
        assert result["first_choice_within"] >= rows, (table, result["first_choice_within"])
        assert result["pooled_spearman"] >= spearman, (table, result["pooled_spearman"])


def test_the_held_out_tables_together_keep_their_figures(validated):
    validate = _module("validate_published")
    summary = validate.overall(list(validated.values()))
    # docs/plan.md: 51 of 61 rows (83.6 %; the target 85 % missed by the PCIe tables), Spearman 0.847 (the target
    # 0.85 missed since the independent 8xL20 table joined), median 12 %
    assert summary["first_share"] >= 0.82 and summary["pooled_spearman"] >= 0.83, summary
    assert summary["median_abs_error"] <= 0.20, summary


def test_every_held_out_table_names_its_publisher(validated):
    validate = _module("validate_published")
    publishers = validate.by_publisher(list(validated.values()))
    assert len(publishers) >= 4 and all(r["publisher"] != r["id"] for r in validated.values())
    assert sum(group["rows"] for group in publishers.values()) == sum(r["row_count"] for r in validated.values())


def test_pcie_ulysses_is_last_in_every_row(validated):
    for entry in validated["usp-l20-pcie"]["rows"]:
        assert max(entry["predicted_ms"], key=entry["predicted_ms"].get) == "U8"


@pytest.mark.slow
@pytest.mark.timing(reason="planned step times against measured CPU runs")
def test_masks_planned_against_measured_cpu_runs(tmp_path, capsys, monkeypatch):
    masks = _module("validate_plan_masks")
    monkeypatch.setattr("sys.argv", ["validate_plan_masks", "--out", str(tmp_path), "--iters", "4"])
    masks.main()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| window") or
             line.startswith("| causal-document")]  # fmt: skip
    assert len(lines) == 4
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        error = float(cells[5].rstrip("%"))
        assert abs(error) <= 40, line  # the benchmark's acceptance is 25 %; a loaded runner adds its noise
    window = [line for line in lines if line.startswith("| window")]
    assert "double-short" in window[0]  # measured fastest: the short ring
