"""Timeline check: the recorder's spans against the PyTorch profiler's, for the profiled iteration.

The profiler is an independent witness (DESIGN: "use it to check the recorder, never the other way round"). What
it says the ring did -- compute, send and recv spans per ring step, from its own op and kernel timestamps -- is
extracted by ringbench/traces/ring_spans.py; this module lines those up with the recorder's spans and judges.

Per (case, repeat, rank), for the profiled iteration K:

* Clocks. The profiler's ``ringbench:iteration K`` range starts at the instant the recorder stamped that rank's
  iteration start (the min ``start_ns`` of its iteration rows for K), so each side is taken relative to its own
  anchor: offsets from the iteration start, in ns. No clock is trusted across the two instruments.
* Matching. Within (phase, step, kind) the i-th recorded span (by start) pairs with the i-th profiled one; what
  is left on either side is unmatched. Recorder compute = block arithmetic of the step (kernel and merge); send /
  recv = exchange posted .. that direction completed.

Per kind: matched and unmatched counts, median and p90 of |Δstart| and |Δduration| (ms, Δ = profiled - recorded),
and the overlap share computed from each side's spans: for send / recv the share of that transfer time during which
the rank computed, for compute the share of compute time during which a transfer was in flight (unions per rank,
pooled over ranks).

A kind passes when nothing is unmatched, the medians of |Δstart| and |Δduration| are within
``abs_ms + rel x (median recorded duration)``, their p90s within twice that (not judged for oversubscribed CPU
cases, see ``agreement``), and the two overlap shares differ by at most ``OVERLAP_TOLERANCE``. docs/results.md has
the figures measured on CPU that set the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ringbench.analysis.confidence import oversubscribed_cases
from ringbench.markers import ITERATION_MARKER
from ringbench.traces.ring_spans import (
    SPAN_KEYS,
    iteration_anchor_ns,
    profiled_iteration,
    profiled_spans,
    with_order,
)

TRACE_KEYS = ["case_id", "repeat", "rank"]
CHECKED_KINDS = ("compute", "send", "recv")

MATCH_COLUMNS = [*TRACE_KEYS, *SPAN_KEYS, "recorded_start_ms", "recorded_ms", "profiled_start_ms", "profiled_ms",
                 "delta_start_ms", "delta_duration_ms", "matched"]  # fmt: skip
OVERLAP_COLUMNS = ["kind", "recorded_overlap", "profiled_overlap"]
AGREEMENT_COLUMNS = ["kind", "matched", "unmatched", "recorded_median_ms", "start_median_ms", "start_p90_ms",
                     "duration_median_ms", "duration_p90_ms", "recorded_overlap", "profiled_overlap",
                     "tolerance_ms", "p90_judged", "passed"]  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class Tolerance:
    """Allowed |Δ| for a kind: ``abs_ms`` plus ``rel`` times the kind's median recorded duration (medians; the
    p90s may reach twice that)."""

    abs_ms: float
    rel: float

    def allowed_ms(self, recorded_median_ms: float) -> float:
        return self.abs_ms + self.rel * recorded_median_ms


# Set from 4-rank gloo rings on a loaded 2-core machine (docs/results.md). Measured medians of |Δ|: 0.15-0.25 ms
# (compute start), 0.6-0.8 ms (compute duration: the recorder's span also holds the online-softmax merge, which
# is no attention op), 0.06-0.13 ms (transfers); p90s up to 1.4 ms where the CPU is not oversubscribed. A rank
# preempted between the recorder's stamp and the op adds single spans of 5-12 ms, which the p90 rule tolerates
# while they stay rare.
DEFAULT_TOLERANCES = {
    "compute": Tolerance(abs_ms=1.5, rel=0.05),
    "send": Tolerance(abs_ms=2.0, rel=0.05),
    "recv": Tolerance(abs_ms=2.0, rel=0.05),
}
OVERLAP_TOLERANCE = 0.15  # absolute difference between the two overlap shares (measured: up to 0.07)


def recorded_spans(events: pd.DataFrame, iteration: int) -> pd.DataFrame:
    """The recorder's compute / send / recv spans of ``iteration`` for every (case, repeat, rank), in ns from that
    rank's iteration start. Columns: TRACE_KEYS + SPAN_KEYS + start_ns, end_ns."""
    rows = events[events["iteration"] == iteration]
    anchors = rows[rows["kind"] == "iteration"].groupby(TRACE_KEYS, observed=True)["start_ns"].min()
    spans = rows[rows["kind"].isin(CHECKED_KINDS)]
    spans = spans.join(anchors.rename("anchor_ns"), on=TRACE_KEYS, how="inner")
    spans = spans.assign(start_ns=spans["start_ns"] - spans["anchor_ns"], end_ns=spans["end_ns"] - spans["anchor_ns"])
    spans = spans[[*TRACE_KEYS, "phase", "step", "kind", "start_ns", "end_ns"]]
    return with_order(spans, TRACE_KEYS)[[*TRACE_KEYS, *SPAN_KEYS, "start_ns", "end_ns"]]


def match_spans(recorded: pd.DataFrame, profiled: pd.DataFrame) -> pd.DataFrame:
    """Pair recorded and profiled spans on (case, repeat, rank, phase, step, kind, order). Columns MATCH_COLUMNS:
    times in ms from the iteration start; Δ = profiled - recorded; NaN on the side a span is missing from."""
    keys = [*TRACE_KEYS, *SPAN_KEYS]
    pairs = recorded[[*keys, "start_ns", "end_ns"]].merge(
        profiled[[*keys, "start_ns", "end_ns"]], on=keys, how="outer", suffixes=("_rec", "_prof")
    )
    out = pairs[keys].copy()
    out["recorded_start_ms"] = pairs["start_ns_rec"] / 1e6
    out["recorded_ms"] = (pairs["end_ns_rec"] - pairs["start_ns_rec"]) / 1e6
    out["profiled_start_ms"] = pairs["start_ns_prof"] / 1e6
    out["profiled_ms"] = (pairs["end_ns_prof"] - pairs["start_ns_prof"]) / 1e6
    out["delta_start_ms"] = out["profiled_start_ms"] - out["recorded_start_ms"]
    out["delta_duration_ms"] = out["profiled_ms"] - out["recorded_ms"]
    out["matched"] = out["delta_start_ms"].notna()
    return out.sort_values(keys, kind="stable").reset_index(drop=True)[MATCH_COLUMNS]


def _merged(starts: np.ndarray, ends: np.ndarray) -> list[tuple[float, float]]:
    """Union of intervals as sorted, disjoint (start, end) pairs."""
    merged: list[list[float]] = []
    for start, end in sorted(zip(starts.tolist(), ends.tolist(), strict=True)):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _covered(intervals, others) -> float:
    """Length of (union of intervals) ∩ (union of others); both lists sorted and disjoint."""
    total, j = 0.0, 0
    for start, end in intervals:
        while j < len(others) and others[j][1] <= start:
            j += 1
        k = j
        while k < len(others) and others[k][0] < end:
            total += max(0.0, min(end, others[k][1]) - max(start, others[k][0]))
            k += 1
    return total


def overlap_shares(matches: pd.DataFrame) -> pd.DataFrame:
    """Per kind: the overlap share from the recorded spans and from the profiled spans (columns OVERLAP_COLUMNS).

    send / recv: share of that transfer time (union per rank) during which the rank computed; compute: share of
    compute time during which a send or receive was in flight. Pooled over ranks: sum of overlapped time over
    sum of time. Each side uses all of its own spans, matched or not.
    """
    rows = []
    for kind in CHECKED_KINDS:
        row = {"kind": kind}
        for side in ("recorded", "profiled"):
            start, length = matches[f"{side}_start_ms"], matches[f"{side}_ms"]
            spans = matches.assign(start=start, end=start + length).dropna(subset=["start"])
            covered = total = 0.0
            for _, rank_spans in spans.groupby(TRACE_KEYS, observed=True):
                mine = rank_spans[rank_spans["kind"] == kind]
                other_kinds = ["send", "recv"] if kind == "compute" else ["compute"]
                others = rank_spans[rank_spans["kind"].isin(other_kinds)]
                intervals = _merged(mine["start"].to_numpy(), mine["end"].to_numpy())
                total += sum(b - a for a, b in intervals)
                covered += _covered(intervals, _merged(others["start"].to_numpy(), others["end"].to_numpy()))
            row[f"{side}_overlap"] = covered / total if total > 0 else np.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=OVERLAP_COLUMNS)


def agreement(
    matches: pd.DataFrame,
    tolerances: dict[str, Tolerance] | None = None,
    overlap_tolerance: float = OVERLAP_TOLERANCE,
    judge_p90: bool = True,
) -> pd.DataFrame:
    """Per kind: counts, |Δstart| and |Δduration| medians and p90s (ms), both overlap shares, and the verdict.

    ``judge_p90=False`` (an oversubscribed CPU: real compute on more ranks than cores) holds only the medians to
    the tolerance: there a rank descheduled inside the recorder's compute span (during the merge, outside any
    attention op) stretches single spans, so the tail measures the scheduler, not the recorder.
    """
    tolerances = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    overlaps = overlap_shares(matches).set_index("kind")
    rows = []
    for kind in CHECKED_KINDS:
        spans = matches[matches["kind"] == kind]
        paired = spans[spans["matched"]]
        start, duration = paired["delta_start_ms"].abs(), paired["delta_duration_ms"].abs()
        recorded_median = float(paired["recorded_ms"].median()) if len(paired) else np.nan
        allowed = tolerances[kind].allowed_ms(0.0 if np.isnan(recorded_median) else recorded_median)
        row = {
            "kind": kind,
            "matched": len(paired),
            "unmatched": len(spans) - len(paired),
            "recorded_median_ms": recorded_median,
            "start_median_ms": start.median(),
            "start_p90_ms": start.quantile(0.9),
            "duration_median_ms": duration.median(),
            "duration_p90_ms": duration.quantile(0.9),
            "recorded_overlap": overlaps.at[kind, "recorded_overlap"],
            "profiled_overlap": overlaps.at[kind, "profiled_overlap"],
            "tolerance_ms": allowed,
        }
        row["p90_judged"] = judge_p90
        within = row["start_median_ms"] <= allowed and row["duration_median_ms"] <= allowed
        if judge_p90:
            within = within and row["start_p90_ms"] <= 2 * allowed and row["duration_p90_ms"] <= 2 * allowed
        overlap_gap = abs(row["recorded_overlap"] - row["profiled_overlap"])
        overlap_ok = bool(overlap_gap <= overlap_tolerance) or (
            np.isnan(row["recorded_overlap"]) and np.isnan(row["profiled_overlap"])
        )
        # Nothing on either side (a one-rank ring has no transfers) agrees; a span on one side only does not.
        row["passed"] = bool(row["unmatched"] == 0 and (len(paired) == 0 or (within and overlap_ok)))
        rows.append(row)
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)


def compare_timelines(
    events: pd.DataFrame, traces: pd.DataFrame, iteration: int | None = None
) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """Events table + concatenated traces (TRACE_KEYS + trace columns) -> (MATCH_COLUMNS table, notes).

    ``iteration``: the profiled iteration K; None takes each trace's own ``ringbench:iteration K`` marker.
    """
    notes, recorded_parts, profiled_parts = [], [], []
    traced = set()
    for key, trace in traces.groupby(TRACE_KEYS, observed=True, sort=True):
        where = f"{key[0]} repeat {key[1]} rank {key[2]}"
        traced.add(key)
        profiled_k = iteration if iteration is not None else profiled_iteration(trace)
        if profiled_k is None or iteration_anchor_ns(trace, profiled_k) is None:
            notes.append(f"{where}: no '{ITERATION_MARKER} {'K' if profiled_k is None else profiled_k}' marker")
            profiled_k = iteration
        else:
            spans = profiled_spans(trace, profiled_k)
            profiled_parts.append(spans.assign(case_id=key[0], repeat=key[1], rank=key[2]))
        mine = events[(events["case_id"] == key[0]) & (events["repeat"] == key[1]) & (events["rank"] == key[2])]
        if profiled_k is not None:
            recorded_parts.append(recorded_spans(mine, profiled_k))
    if iteration is not None:  # ranks the recorder saw but the profiler did not
        recorded_all = recorded_spans(events, iteration)
        keys = recorded_all[TRACE_KEYS].apply(tuple, axis=1) if len(recorded_all) else pd.Series(dtype=object)
        untraced = recorded_all[~keys.isin(traced)]
        for key in sorted(set(untraced[TRACE_KEYS].apply(tuple, axis=1))) if len(untraced) else []:
            notes.append(f"{key[0]} repeat {key[1]} rank {key[2]}: recorded spans but no profiler trace")
        recorded_parts.append(untraced)
    recorded = _concat(recorded_parts, [*TRACE_KEYS, *SPAN_KEYS, "start_ns", "end_ns"])
    profiled = _concat(profiled_parts, [*TRACE_KEYS, *SPAN_KEYS, "start_ns", "end_ns"])
    return match_spans(recorded, profiled), tuple(notes)


def _concat(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frame = pd.concat([p[columns] for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else None
    if frame is None:
        frame = pd.DataFrame({c: pd.Series(dtype=object if c in ("case_id", "phase", "kind") else "int64")
                              for c in columns})  # fmt: skip
    for column in ("repeat", "rank", "step", "order", "start_ns", "end_ns"):
        frame[column] = frame[column].astype("int64")
    return frame


@dataclass(frozen=True, kw_only=True, slots=True)
class TimelineCheck:
    """The outcome of ``check-timeline``: per-kind agreement pooled over cases, per case, and every pair."""

    run_id: str
    iteration: int | None  # the profiled iteration (None: taken from each trace's marker)
    agreement: pd.DataFrame  # AGREEMENT_COLUMNS, pooled over cases, repeats and ranks (passed: in every case)
    by_case: pd.DataFrame  # case_id + AGREEMENT_COLUMNS
    matches: pd.DataFrame  # MATCH_COLUMNS
    emulated: bool = False
    notes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return bool(self.agreement["passed"].all()) and bool(self.by_case["passed"].all())


def check_timeline(run) -> TimelineCheck:
    """Check a loaded run (ringbench.record.store.RunData) against its ``profile/`` traces."""
    from ringbench.errors import UsageError
    from ringbench.traces.profile_set import load_profile_set

    profile = load_profile_set(run.path, run.meta)
    if not run.events["kind"].isin(CHECKED_KINDS).any():
        raise UsageError(f"{run.path}: no compute/send/recv spans to check (recorded with --no-trace?)")
    matches, notes = compare_timelines(run.events, profile.traces, profile.iteration)
    if matches.empty:
        raise UsageError(f"{run.path}: no spans to compare (no iteration marker in the traces?)")
    crowded = oversubscribed_cases(run.cases, run.meta)
    by_case = pd.concat(
        [agreement(group, judge_p90=case_id not in crowded).assign(case_id=case_id)
         for case_id, group in matches.groupby("case_id", sort=True)],
        ignore_index=True,
    )[["case_id", *AGREEMENT_COLUMNS]]  # fmt: skip
    if crowded & set(by_case["case_id"]):
        count = len(crowded & set(by_case["case_id"]))
        notes += (f"p90s not judged in {count} case(s): real compute on more ranks than CPU cores, so a descheduled "
                  "rank stretches single spans (the medians are still judged); use an emulated kernel",)  # fmt: skip
    pooled = agreement(matches)
    verdicts = by_case.groupby("kind")[["passed", "p90_judged"]].all()
    pooled["passed"] = pooled["kind"].map(verdicts["passed"]).fillna(True).astype(bool)
    pooled["p90_judged"] = pooled["kind"].map(verdicts["p90_judged"]).fillna(True).astype(bool)
    return TimelineCheck(
        run_id=run.run_id,
        iteration=profile.iteration,
        agreement=pooled,
        by_case=by_case,
        matches=matches,
        emulated=run.emulated,
        notes=notes,
    )


def timeline_document(check: TimelineCheck) -> dict:
    """The ``--json`` document: verdict, tolerances, per-kind rows (pooled and per case), notes."""

    def records(frame: pd.DataFrame) -> list[dict]:
        return [{k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()}
                for row in frame.astype(object).to_dict("records")]  # fmt: skip

    return {
        "run_id": check.run_id,
        "iteration": check.iteration,
        "passed": check.passed,
        "emulated": check.emulated,
        "tolerances": {kind: {"abs_ms": t.abs_ms, "rel": t.rel} for kind, t in DEFAULT_TOLERANCES.items()}
        | {"overlap": OVERLAP_TOLERANCE},
        "kinds": records(check.agreement),
        "cases": records(check.by_case),
        "notes": list(check.notes),
    }
