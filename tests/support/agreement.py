"""How far an imported record is from ringbench's own recorder on the same run (the self-import check).

Both records of one iteration are paired span by span on (rank, phase, step, kind, order within that key): the
import must find ringbench's ring order, steps, peers and bytes exactly, and its times must be close. Times are
taken per rank from an anchor on each side: the iteration's start where both records have ``iteration`` rows,
else the median offset of the rank's compute spans (a record without iteration rows, such as the fixture's
events.csv). docs/import.md gives the measured agreement and the tolerances the tests hold it to.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

KEYS = ["rank", "phase", "step", "kind", "order"]
KINDS = ("compute", "send", "recv", "wait")
AGREEMENT_COLUMNS = ["kind", "pairs", "missing", "extra", "start_median_ms", "start_p90_ms", "duration_median_ms",
                     "duration_p90_ms", "same_peers", "same_bytes"]  # fmt: skip


def _keyed(events: pd.DataFrame) -> pd.DataFrame:
    spans = events[events["kind"].isin(KINDS)].sort_values(["rank", "phase", "step", "kind", "start_ns"])
    return spans.assign(order=spans.groupby(["rank", "phase", "step", "kind"]).cumcount())


def pair_spans(recorded: pd.DataFrame, imported: pd.DataFrame) -> pd.DataFrame:
    """Outer join of both records' spans on KEYS, with Δstart and Δduration in ms (imported - recorded)."""
    both = _keyed(recorded).merge(_keyed(imported), on=KEYS, how="outer", suffixes=("_rec", "_imp"))
    both["delta_start_ms"] = (both["start_ns_imp"] - both["start_ns_rec"]) / 1e6
    rec_ms = (both["end_ns_rec"] - both["start_ns_rec"]) / 1e6
    both["delta_duration_ms"] = (both["end_ns_imp"] - both["start_ns_imp"]) / 1e6 - rec_ms
    anchors = {}
    for side, frame in (("rec", recorded), ("imp", imported)):
        rows = frame[frame["kind"] == "iteration"]
        anchors[side] = rows.groupby("rank")["start_ns"].min() if len(rows) else None
    if anchors["rec"] is not None and anchors["imp"] is not None:
        offset = (anchors["imp"] - anchors["rec"]) / 1e6
    else:
        offset = both[both["kind"] == "compute"].groupby("rank")["delta_start_ms"].median()
    both["delta_start_ms"] -= both["rank"].map(offset).fillna(0.0)
    return both


def agreement(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per kind: pairs, spans on one side only, |Δstart| and |Δduration| median / p90 (ms), share of pairs with
    the same peers (src, dst) and the same bytes."""
    rows = []
    for kind in KINDS:
        spans = pairs[pairs["kind"] == kind]
        paired = spans.dropna(subset=["start_ns_rec", "start_ns_imp"])
        start, duration = paired["delta_start_ms"].abs(), paired["delta_duration_ms"].abs()
        rows.append({
            "kind": kind, "pairs": len(paired), "missing": int(spans["start_ns_imp"].isna().sum()),
            "extra": int(spans["start_ns_rec"].isna().sum()),
            "start_median_ms": start.median(), "start_p90_ms": start.quantile(0.9),
            "duration_median_ms": duration.median(), "duration_p90_ms": duration.quantile(0.9),
            "same_peers": float(((paired["src_rec"] == paired["src_imp"]) & (paired["dst_rec"] == paired["dst_imp"]))
                                .mean()) if len(paired) else np.nan,
            "same_bytes": float((paired["bytes_rec"] == paired["bytes_imp"]).mean()) if len(paired) else np.nan,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)


__all__ = ["AGREEMENT_COLUMNS", "agreement", "pair_spans"]
