"""Fit the implementation families' host times (the catalogue's ``frameworks:``) on the dev set.

    python benchmarks/fit_framework_overheads.py              # every family of benchmarks/published/dev.yaml
    python benchmarks/fit_framework_overheads.py --family usp

A family's rows (benchmarks/published/dev.yaml, never a table of tables.yaml) are priced exactly as
benchmarks/validate_published.py prices them -- the catalogue's GPU, kernel and link priors, the table's topology --
with trial values of the family's three host figures (simulate/host_floor.py: a phase takes at least call + steps x
step + all-to-alls x all-to-all): ``host_call_us``, ``host_step_us``, ``host_alltoall_us``. The fit minimises the
median over every (row, configuration) of |log(predicted / measured absolute time)| by coordinate descent over
log-spaced grids (three rounds; a figure no row exercises keeps its catalogue value). It prints the fitted values,
the residual before and after, and the lines to put in ringbench/hardware/catalogue.yaml; it changes no file.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path

import numpy as np
import yaml

from ringbench.hardware import Figure, Framework, find_framework

HERE = Path(__file__).resolve().parent
GRID = np.concatenate([[0.0], np.geomspace(5.0, 5000.0, 31)])  # microseconds
FIGURES = ("host_call_us", "host_step_us", "host_alltoall_us")


def _validate():
    spec = importlib.util.spec_from_file_location("validate_published", HERE / "validate_published.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _errors(validate, tables: list[dict], family: Framework) -> np.ndarray:
    """log(predicted / measured) of every (row, configuration) of ``tables`` priced with ``family``."""
    out = []
    for table in tables:
        result = validate.validate_table(table, framework=family)
        out += [math.log1p(e) for entry in result["rows"] for e in entry["errors"].values()]
    return np.array(out)


def _trial(base: Framework, values: dict[str, float]) -> Framework:
    derived = "trial value of benchmarks/fit_framework_overheads.py"
    figures = {name: Figure(value=float(values[name]), derived=derived) for name in FIGURES}
    return Framework(key=base.key, title=base.title, aliases=base.aliases, **figures)


def _exercised(tables: list[dict]) -> list[str]:
    """The figures some configuration of ``tables`` runs (a ring's steps, an all-to-all or collective)."""
    kinds = {str(c.get("strategy", "ring")).split(":")[0] for t in tables for c in t["configs"].values()}
    out = ["host_call_us"]
    if kinds & {"ring", "hybrid", "double-ring"}:
        out.append("host_step_us")
    if kinds & {"ulysses", "hybrid", "allgather", "double-ring"}:
        out.append("host_alltoall_us")
    return out


def fit(validate, family_key: str, tables: list[dict]) -> dict:
    base = find_framework(family_key)
    values = {name: getattr(base, name).value for name in FIGURES}
    start = float(np.median(np.abs(_errors(validate, tables, _trial(base, values)))))
    axes = _exercised(tables)
    for _ in range(3):
        for axis in axes:
            scores = []
            for value in GRID:
                scores.append(
                    float(np.median(np.abs(_errors(validate, tables, _trial(base, {**values, axis: value})))))
                )
            values[axis] = float(GRID[int(np.argmin(scores))])
    errors = _errors(validate, tables, _trial(base, values))
    return {"family": family_key, **values, "exercised": axes, "entries": len(errors),
            "tables": [t["id"] for t in tables], "median_abs_log_error_before": start,
            "median_abs_error_after": float(np.median(np.abs(np.expm1(errors)))),
            "median_signed_error_after": float(np.median(np.expm1(errors)))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", help="only this family (repeatable)")
    args = parser.parse_args()
    validate = _validate()
    tables = yaml.safe_load((HERE / "published" / "dev.yaml").read_text())["tables"]
    families = list(dict.fromkeys(t["framework"] for t in tables))
    for key in families:
        if args.family and key not in args.family:
            continue
        result = fit(validate, key, [t for t in tables if t["framework"] == key])
        figures = ", ".join(f"{name} {result[name]:.0f}{'' if name in result['exercised'] else ' (not exercised)'}"
                            for name in FIGURES)  # fmt: skip
        print(f"{key}: {figures}; {result['entries']} entries of {', '.join(result['tables'])}: median |error| "
              f"{100 * math.expm1(result['median_abs_log_error_before']):.1f}% with the catalogue's figures -> "
              f"{100 * result['median_abs_error_after']:.1f}% (median signed "
              f"{100 * result['median_signed_error_after']:+.1f}%)")  # fmt: skip


if __name__ == "__main__":
    main()
