"""Conformance: a check's per-tensor rows -> findings, the error-against-world table, the matrix as a grid.

Pure functions of three tables that `ringbench check` makes (ringbench/conformance/check.py):
* cases (CASE_COLUMNS): one row per case -- its axes, status (pass, fail, skip), a failure that gave no tensors
  (error, shape, hang, died, refused) with its line and ranks, and per tensor the worst error and kind;
* tensors (TENSOR_COLUMNS): one row per (case, tensor, rank) -- max abs and relative error, tolerance, non-finite
  count, kind (ok, wrong, imprecise, nonfinite), where (token positions) and the case's diagnosis;
* invariance: the same global problem at two CP degrees, per tensor, agree or not.

A finding groups the failing (case, tensor) pairs that share tensor, kind and diagnosis; it names the ranks, the
worst case and where it fails there, the worst errors against the tolerance, and adds what the differences between
cases show (``_pattern``): wrong at CP = 1 too (the attention, not the ring), only with grouped-query attention,
only with some layouts or masks, only with uneven shards, error growing with the CP degree.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

CASE_COLUMNS = ["case_id", "world", "seq", "heads", "kv_heads", "head_dim", "batch", "dtype", "mask", "docs",
                "layout", "purpose", "even", "seconds", "status", "failure", "failure_line", "failure_ranks", "lse",
                *(f"{t}_{k}" for t in ("out", "lse", "dq", "dk", "dv") for k in ("err", "rel", "rms", "kind"))]  # fmt: skip
TENSOR_COLUMNS = ["case_id", "tensor", "rank", "max_abs_err", "max_rel_err", "rms_rel_err", "tolerance", "scale",
                  "nonfinite",
                  "kind", "bad_rows", "rows", "where", "nonfinite_where", "diagnosis"]  # fmt: skip
FINDING_COLUMNS = ["tensor", "kind", "ranks", "max_abs_err", "max_rel_err", "tolerance", "diagnosis", "where",
                   "cases", "case_count", "worst_case", "dtypes", "worlds", "masks", "layouts"]  # fmt: skip
PRECISION_COLUMNS = ["dtype", "world", "cases", "out_rel", "grad_rel", "rtol"]
KIND_ORDER = {"hang": 0, "died": 1, "error": 2, "shape": 3, "nonfinite": 4, "wrong": 5, "imprecise": 6}
GROWTH = 1.8
"""RMS error at the largest CP degree over the RMS error at the smallest, for one global problem, above which the
error is said to grow with the CP degree. A correct ring merges in fp32: its blocks' rounding errors are averaged
with weights that sum to one, so the RMS error stays flat (measured 1.0-1.2x from N = 1 to 8); partials rounded to
bf16 / fp16 at each merge add a rounding per block (measured 3.1-3.2x): docs/implementations.md."""
LOW_PRECISION = ("bfloat16", "float16")


def _mask_family(mask: str) -> str:
    head, _, tail = str(mask).partition("window:")
    return head + "window" if tail else str(mask)


def _per_case_tensor(tensors: pd.DataFrame) -> pd.DataFrame:
    """(case, tensor) rows: worst kind and errors over ranks, the failing ranks, where they fail."""
    failing = tensors[tensors["kind"] != "ok"]
    if failing.empty:
        return pd.DataFrame(columns=["case_id", "tensor", "kind", "ranks", "max_abs_err", "max_rel_err",
                                     "tolerance", "diagnosis", "where"])  # fmt: skip
    rows = []
    for (case_id, tensor), group in failing.groupby(["case_id", "tensor"], sort=False):
        kind = min(group["kind"], key=lambda k: KIND_ORDER.get(k, 9))
        worst = group.loc[group["max_abs_err"].idxmax()]
        wheres = [f"rank {r}: {w}" for r, w in zip(group["rank"], group["where"], strict=True) if w]
        nonfinite = [f"rank {r}: {w}" for r, w in zip(group["rank"], group["nonfinite_where"], strict=True) if w]
        rows.append({"case_id": case_id, "tensor": tensor, "kind": kind, "ranks": sorted(int(r) for r in group["rank"]),
                     "max_abs_err": float(group["max_abs_err"].max()), "max_rel_err": float(group["max_rel_err"].max()),
                     "tolerance": float(worst["tolerance"]), "diagnosis": str(worst["diagnosis"] or ""),
                     "where": "; ".join(nonfinite if kind == "nonfinite" else wheres)})  # fmt: skip
    return pd.DataFrame(rows)


def _pattern(failing: pd.DataFrame, ran: pd.DataFrame) -> list[str]:
    """What the differences between cases say: ``failing`` are the cases where a tensor (or the call) fails,
    ``ran`` every case that ran; a pattern is said only when cases without the feature ran and none failed."""
    notes = []
    others = ran[~ran["case_id"].isin(failing["case_id"])]
    alike = others[others["mask_family"].isin(set(failing["mask_family"]))]  # CP = 1 said of the same masks only
    if (failing["world"] == 1).all() and (others["world"] > 1).any():
        notes.append(
            "fails only at CP = 1 (a ring with no peer: gloo refuses a rank's send to itself; an "
            "implementation that needs peers declares ringbench_min_world = 2)"
        )
    elif (failing["world"] == 1).any():
        notes.append("wrong at CP = 1 too: the error is in the attention itself, not in the ring")
    elif (alike["world"] == 1).any():
        notes.append("right at CP = 1: the ring breaks it")
    features = (
        (lambda t: t["kv_heads"] < t["heads"], "fails only with grouped-query attention (KV heads < heads)"),
        (lambda t: ~t["even"].astype(bool), "fails only with uneven shards (S not a multiple of the world)"),
    )
    for feature, text in features:
        if len(failing) and feature(failing).all() and (~feature(others)).any():
            notes.append(text)
    for column, label in (("layout", "layout"), ("mask_family", "mask")):
        bad = set(failing[column])
        good = others[~others[column].isin(bad)]
        if len(bad) == 1 and len(failing) >= 2 and len(good) >= 2:  # one value, seen failing twice: a structure
            notes.append(
                f"fails only with {label} {next(iter(bad))} (passes with {', '.join(sorted(set(good[column])))})"
            )
    return notes


def _growth(cases: pd.DataFrame, dtype: str) -> dict | None:
    """The ladder (one global problem at CP = 1, 2, 3, 4, 8) in one low-precision dtype, when its error grows with
    the CP degree: {tensor, ratio, text, case_id} for the tensor whose RMS relative error grows most from the
    smallest world to the largest (the RMS: the largest error of a tensor is one element's luck)."""
    ladder = cases[(cases["purpose"] == "ladder") & (cases["dtype"] == dtype)]
    best = None
    for tensor in ("out", "lse", "dq", "dk", "dv"):
        column = f"{tensor}_rms"
        if ladder.empty or column not in ladder or ladder[column].isna().all():
            continue
        by_world = ladder.groupby("world")[column].max().dropna()
        if len(by_world) < 3 or by_world.iloc[0] <= 0:
            continue
        ratio = float(by_world.iloc[-1] / by_world.iloc[0])
        if ratio >= GROWTH and (best is None or ratio > best["ratio"]):
            steps = ", ".join(f"{e:.1e} at N={w}" for w, e in by_world.items())
            last = ladder[ladder["world"] == by_world.index[-1]].iloc[0]
            best = {"tensor": tensor, "ratio": ratio, "case_id": str(last["case_id"]), "case": last,
                    "text": f"error grows with the CP degree ({tensor} RMS error {ratio:.1f}x from "
                            f"N={by_world.index[0]} to N={by_world.index[-1]}: {steps}): partials kept in low "
                            "precision"}  # fmt: skip
    return best


def findings_table(cases: pd.DataFrame, tensors: pd.DataFrame, invariance: pd.DataFrame | None = None) -> pd.DataFrame:
    """FINDING_COLUMNS, the worst first (module doc)."""
    if cases.empty:
        return pd.DataFrame(columns=FINDING_COLUMNS)
    cases = cases.assign(mask_family=cases["mask"].map(_mask_family))
    ran = cases[cases["status"].isin(["pass", "fail"])]
    rows = []
    pairs = _per_case_tensor(tensors)
    if not pairs.empty:
        pairs = pairs.merge(cases, on="case_id", how="left", suffixes=("", "_case"))
        for (tensor, kind, diagnosis), group in pairs.groupby(["tensor", "kind", "diagnosis"], sort=False):
            notes = [diagnosis] if diagnosis else []
            for dtype in sorted(set(group["dtype"]) & set(LOW_PRECISION)):
                grown = _growth(cases, dtype) if kind == "imprecise" else None
                if grown:
                    notes.append(grown["text"])
            if kind != "imprecise":  # rounding is no structure: which layouts or masks cross the bar is chance
                notes += _pattern(pairs[pairs["tensor"] == tensor], ran)
            rows.append(_finding(tensor, kind, "; ".join(notes), group))
    for dtype in LOW_PRECISION:  # growth is a finding even within the tolerance: a larger N would cross it
        grown = _growth(cases, dtype)
        if grown and not any(grown["text"] in row["diagnosis"] for row in rows):
            case = grown["case"]
            rows.append({"tensor": grown["tensor"], "kind": "imprecise", "ranks": list(range(int(case["world"]))),
                         "max_abs_err": float(case[f"{grown['tensor']}_err"]),
                         "max_rel_err": float(case[f"{grown['tensor']}_rel"]), "tolerance": math.nan,
                         "diagnosis": grown["text"], "where": "every rank (the ladder: one problem at each CP degree)",
                         **_spread(cases[(cases["purpose"] == "ladder") & (cases["dtype"] == dtype)])})  # fmt: skip
    failed = cases[cases["failure"].fillna("").astype(bool) & (cases["status"] == "fail")]
    if not failed.empty:
        failed = failed.assign(line_key=failed["failure_line"].map(_line_key))
        for (kind, _), group in failed.groupby(["failure", "line_key"], sort=False):
            ranks = sorted({int(r) for text in group["failure_ranks"] for r in str(text).split(",") if r != ""})
            notes = [_failure_diagnosis(kind, str(group.iloc[0]["failure_line"]), group, cases)]
            notes += _pattern(failed[failed["failure"] == kind], ran)
            rows.append({"tensor": "-", "kind": kind, "ranks": ranks, "max_abs_err": math.nan,
                         "max_rel_err": math.nan, "tolerance": math.nan, "diagnosis": "; ".join(notes),
                         "where": str(group.iloc[0]["failure_line"]), **_spread(group)})  # fmt: skip
    out = pd.DataFrame(rows, columns=FINDING_COLUMNS)
    if out.empty:
        return out
    order = out["kind"].map(lambda k: KIND_ORDER.get(k, 9))
    return out.assign(_order=order).sort_values(["_order", "case_count"], ascending=[True, False],
                                                kind="stable").drop(columns="_order").reset_index(drop=True)  # fmt: skip


def _line_key(line: str) -> str:
    """A failure line without what varies between cases of one cause: ranks, sizes, numbers."""
    head = re.sub(r" \(rank \d+.*$", "", str(line))
    return re.sub(r"\d+", "N", head)


def _spread(group: pd.DataFrame) -> dict:
    return {"cases": list(group["case_id"]), "case_count": len(group), "worst_case": str(group.iloc[0]["case_id"]),
            "dtypes": sorted(set(group["dtype"])), "worlds": sorted(int(w) for w in set(group["world"])),
            "masks": sorted(set(group["mask"])), "layouts": sorted(set(group["layout"]))}  # fmt: skip


def _finding(tensor: str, kind: str, diagnosis: str, group: pd.DataFrame) -> dict:
    worst = group.loc[group["max_abs_err"].idxmax()] if group["max_abs_err"].notna().any() else group.iloc[0]
    ranks = sorted({r for ranks in group["ranks"] for r in ranks})
    spread = _spread(group)
    spread["worst_case"] = str(worst["case_id"])
    nonfinite = kind == "nonfinite"  # its error is NaN: the finite part's would read as a pass
    return {"tensor": tensor, "kind": kind, "ranks": ranks,
            "max_abs_err": math.nan if nonfinite else float(worst["max_abs_err"]),
            "max_rel_err": math.nan if nonfinite else float(worst["max_rel_err"]), "tolerance": float(worst["tolerance"]),
            "diagnosis": diagnosis, "where": str(worst["where"]), **spread}  # fmt: skip


def _failure_diagnosis(kind: str, line: str, group: pd.DataFrame, cases: pd.DataFrame) -> str:
    masks = sorted(set(group["mask_family"]))
    with_masks = cases[cases["mask_family"].isin(masks) & (cases["status"] != "skip")]
    if kind == "error" and len(with_masks) == len(group) and len(cases[cases["status"] == "pass"]):
        return f"declares mask {', '.join(masks)} but raises on every case with it (the other masks run): {line}"
    if kind == "hang":
        return f"a stalled rank: {line}"
    if kind == "shape":
        return f"returns what the interface does not promise: {line}"
    if kind == "died":
        return f"a rank process ended: {line}"
    return line


def verdict_of(findings: pd.DataFrame, cases: pd.DataFrame | None = None) -> str:
    if len(findings):
        return "fail"
    if cases is not None and len(cases) and (cases["status"] == "skip").all():
        return "skip"
    return "pass"


def precision_table(cases: pd.DataFrame) -> pd.DataFrame:
    """Per low-precision dtype and world: the worst relative error of out and of the gradients (largest error
    over the tensor's scale), over the cases that returned tensors; ``rtol`` is filled by the caller's tolerance."""
    if cases.empty:
        return pd.DataFrame(columns=PRECISION_COLUMNS)
    table = cases[cases["dtype"].isin(LOW_PRECISION) & cases["out_rel"].notna()]
    if table.empty:
        return pd.DataFrame(columns=PRECISION_COLUMNS)
    grads = table[["dq_rel", "dk_rel", "dv_rel"]].max(axis=1)
    table = table.assign(grad_rel=grads)
    out = table.groupby(["dtype", "world"]).agg(cases=("case_id", "size"), out_rel=("out_rel", "max"),
                                                 grad_rel=("grad_rel", "max")).reset_index()  # fmt: skip
    out["rtol"] = np.nan
    return out[PRECISION_COLUMNS]


def grid_table(cases: pd.DataFrame) -> pd.DataFrame:
    """The matrix as a grid: one row per (mask, layout), one column per world; each cell counts passed / run
    cases and names the worst failure kind ('' where nothing ran)."""
    if cases.empty:
        return pd.DataFrame()
    table = cases.assign(mask_family=cases["mask"].map(_mask_family))
    worlds = sorted(int(w) for w in set(table["world"]))
    rows = []
    for (mask, layout), group in table.groupby(["mask_family", "layout"], sort=True):
        row = {"mask": mask, "layout": layout}
        for world in worlds:
            part = group[group["world"] == world]
            row[f"N={world}"] = _cell(part)
        rows.append(row)
    return pd.DataFrame(rows)


def _cell(part: pd.DataFrame) -> str:
    ran = part[part["status"] != "skip"]
    if ran.empty:
        return ""
    passed = int((ran["status"] == "pass").sum())
    if passed == len(ran):
        return f"ok {passed}"
    kinds = [k for k in ran["failure"].tolist() if k] + [
        k for col in ("out_kind", "lse_kind", "dq_kind", "dk_kind", "dv_kind") for k in ran[col].dropna().tolist()
        if k not in ("ok", "")]  # fmt: skip
    worst = min(kinds, key=lambda k: KIND_ORDER.get(k, 9)) if kinds else "fail"
    return f"{worst} {len(ran) - passed}/{len(ran)}"


__all__ = ["CASE_COLUMNS", "FINDING_COLUMNS", "GROWTH", "PRECISION_COLUMNS", "TENSOR_COLUMNS", "findings_table",
           "grid_table", "precision_table", "verdict_of"]  # fmt: skip
