"""What `ringbench check` prints: the findings first, then the matrix, the error against world size, the
invariance across CP degrees; the progress line of a case; the --json document."""

from __future__ import annotations

import math

from ringbench.analysis.conformance import grid_table, precision_table
from ringbench.fmt import json_value

SHORT = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def progress_line(row: dict, done: int, total: int) -> str:
    status = row["status"]
    if row.get("failure"):
        detail = f"{row['failure']}: {row['failure_line']}"
    else:
        errs = [f"{t} {_error_text(row, t)}" for t in ("out", "dq", "dk", "dv") if _error_text(row, t)]
        bad = [t for t in ("out", "lse", "dq", "dk", "dv") if row.get(f"{t}_kind") not in ("ok", "", None)]
        detail = ("rel err " + ", ".join(errs)) + (f"  FAIL {', '.join(bad)}" if bad else "")
    return f"[{done}/{total}] {row['case_id']}  {status}  {detail}  ({row['seconds']:.2f} s)"


def _error_text(row: dict, tensor: str) -> str:
    """A tensor's relative error as the progress line shows it: NaN/inf when it holds them, '' when not compared."""
    if row.get(f"{tensor}_kind") == "nonfinite":
        return "NaN/inf"
    rel = row.get(f"{tensor}_rel", math.nan)
    return "" if rel is None or rel != rel else f"{rel:.1e}"


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _spread(finding: dict) -> str:
    worlds = finding["worlds"]
    world = f"N={worlds[0]}" if len(worlds) == 1 else f"N={','.join(map(str, worlds))}"
    dtypes = "/".join(SHORT.get(d, d) for d in finding["dtypes"])
    return f"{finding['case_count']} case(s): {dtypes}, {world}, {', '.join(finding['masks'][:4])}" + (
        "..." if len(finding["masks"]) > 4 else "") + f", {'/'.join(finding['layouts'])}"  # fmt: skip


def finding_lines(index: int, finding: dict) -> list[str]:
    head = f"{index}. {finding['tensor']} {finding['kind'].upper()} on rank(s) {_ranks(finding['ranks'])} in {_spread(finding)}"
    lines = [head]
    if finding["kind"] == "nonfinite":
        lines.append(f"   NaN or inf, worst in {finding['worst_case']}")
    elif finding["max_abs_err"] == finding["max_abs_err"]:
        lines.append(f"   max abs err {finding['max_abs_err']:.2e} (rel {finding['max_rel_err']:.1e}) against "
                     f"tolerance {finding['tolerance']:.1e}, worst in {finding['worst_case']}")  # fmt: skip
    if finding["where"]:
        lines.append(f"   where: {finding['where'][:300]}")
    if finding["diagnosis"]:
        lines.append(f"   diagnosis: {finding['diagnosis']}")
    return lines


def check_lines(outcome) -> list[str]:
    cases, findings = outcome.cases, outcome.findings
    ran = cases[cases["status"] != "skip"]
    failed = int((ran["status"] == "fail").sum())
    verdict = outcome.verdict.upper()
    lines = [f"ringbench check {outcome.impl}: {verdict} -- {len(findings)} finding(s); {len(ran) - failed} of "
             f"{len(ran)} case(s) pass ({outcome.seconds:.1f} s); {outcome.note}"]  # fmt: skip
    for index, finding in enumerate(findings.to_dict("records"), start=1):
        lines += finding_lines(index, finding)
    grid = grid_table(cases)
    if len(grid):
        lines.append("matrix (passed cases per mask x layout and world; a failure shows its worst kind):")
        lines += _text_table(grid)
    precision = precision_table(cases)
    if len(precision):
        lines.append("low precision: worst relative error (max |err| / max |ref|) against world size:")
        rows = [{"dtype": SHORT.get(r["dtype"], r["dtype"]), "N": int(r["world"]), "cases": int(r["cases"]),
                 "out": f"{r['out_rel']:.1e}", "dq/dk/dv": f"{r['grad_rel']:.1e}"}
                for r in precision.to_dict("records")]  # fmt: skip
        lines += _text_table(rows)
    invariance = outcome.invariance
    if len(invariance):
        broken = invariance[~invariance["agree"].astype(bool)]
        pairs = sorted({(int(w), int(o)) for w, o in zip(invariance["world"], invariance["other_world"], strict=True)})
        said = ", ".join(f"CP={o} vs {w}" for w, o in pairs[:6])
        lines.append(f"CP-degree invariance ({said}): " + ("the same global inputs agree within tolerance"
                     if broken.empty else f"{len(broken)} tensor(s) disagree, e.g. {broken.iloc[0]['case_id']} "
                     f"{broken.iloc[0]['tensor']} by {broken.iloc[0]['max_abs_diff']:.1e}"))  # fmt: skip
    for line in outcome.skipped[:3]:
        lines.append(f"skipped: {line}")
    return lines


def _text_table(rows) -> list[str]:
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
    if not records:
        return []
    columns = list(records[0])
    widths = {c: max(len(str(c)), *(len(str(r[c])) for r in records)) for c in columns}
    out = ["  " + "  ".join(str(c).ljust(widths[c]) for c in columns)]
    out += ["  " + "  ".join(str(r[c]).ljust(widths[c]) for c in columns) for r in records]
    return out


def check_document(outcome) -> dict:
    """The --json document: verdict, cases, findings, and the tables behind them."""
    findings = [json_value(f) for f in outcome.findings.to_dict("records")]
    cases = [json_value(c) for c in outcome.cases.to_dict("records")]
    return {"impl": outcome.impl, "verdict": outcome.verdict, "note": outcome.note, "seconds": outcome.seconds,
            "adapter": json_value(outcome.adapter), "cases": cases, "findings": findings,
            "tensors": [json_value(t) for t in outcome.tensors[outcome.tensors["kind"] != "ok"].to_dict("records")],
            "precision": [json_value(r) for r in precision_table(outcome.cases).to_dict("records")],
            "invariance": [json_value(r) for r in outcome.invariance.to_dict("records")],
            "skipped": outcome.skipped}  # fmt: skip
