"""Channels: did two exchanges in flight at once on one rank share a process group?

On NCCL a process group is one communicator with one stream per device, so two exchanges in flight on one group
run one after the other: the second's receive span then holds the first's transfer, and the hop table charges it
to the wrong hop (ringbench/engine/pgroups.py). Every exchange row records the channel it used (``comm_group``,
schema version 4); this module finds the exchanges of one rank that overlapped in time on one channel.

An *exchange* is what one post started: the send / recv rows of one rank with the same channel, iteration, layer
and start (an all-to-all's pairs are one exchange). It lasts from its post to the last of its rows' ends. Labels
``shared:<role>`` all name the caller's one group, so they count as one channel; a record without the column
(older versions, imports, the simulator) has nothing to judge.

A test's oracle, not an analysis of ``ringbench analyze``: ringbench's own runs give every ring its own group, so on
their records it finds nothing by construction (what tests/test_channels.py holds), and the records of other
programs (imports) carry no channel.
"""

from __future__ import annotations

import pandas as pd

SHARED_COLUMNS = ["case_id", "rank", "iteration", "layer", "channel", "first", "second", "overlap_ms"]
_KEYS = ["case_id", "repeat", "iteration", "layer", "rank", "channel"]


def channel_of(label: object) -> str | None:
    """The channel a ``comm_group`` label names: the label itself, "shared" for the caller's group, None when absent."""
    if not isinstance(label, str) or not label:
        return None
    return "shared" if label.startswith("shared:") else label


def exchanges(events: pd.DataFrame) -> pd.DataFrame:
    """One row per exchange: its keys, start and end, and what it was (phase, step, exchange) for the report."""
    if "comm_group" not in events:
        return pd.DataFrame(columns=[*_KEYS, "start_ns", "end_ns", "what"])
    rows = events[events["kind"].isin(("send", "recv"))].copy()
    rows["channel"] = rows["comm_group"].map(channel_of)
    rows = rows[rows["channel"].notna()]
    for column, default in (("repeat", 0), ("layer", 0), ("exchange", "")):
        if column not in rows:
            rows[column] = default
    rows["exchange"] = rows["exchange"].fillna("").astype(str)
    grouped = rows.groupby([*_KEYS, "start_ns"], sort=True, dropna=False)
    out = grouped.agg(end_ns=("end_ns", "max"), phase=("phase", "first"), step=("step", "first"),
                      exchange=("exchange", "first"), label=("comm_group", "first")).reset_index()  # fmt: skip
    out["what"] = out["phase"] + " step " + out["step"].astype(str) + " " + out["exchange"].where(
        out["exchange"] != "", "kv/dkv") + " on " + out["label"]  # fmt: skip
    return out


def shared_channels(events: pd.DataFrame) -> pd.DataFrame:
    """Pairs of exchanges of one rank that were in flight at once on one channel (none: every concurrent ring had
    its own group). ``overlap_ms``: how long both were in flight."""
    found = []
    for _, part in exchanges(events).groupby(_KEYS, sort=False):
        part = part.sort_values("start_ns")
        latest = None  # the exchange, of those before, that ends last
        for row in part.itertuples(index=False):
            if latest is not None and row.start_ns < latest.end_ns:
                found.append({"case_id": row.case_id, "rank": row.rank, "iteration": row.iteration,
                              "layer": row.layer, "channel": row.channel, "first": latest.what, "second": row.what,
                              "overlap_ms": (min(row.end_ns, latest.end_ns) - row.start_ns) / 1e6})  # fmt: skip
            if latest is None or row.end_ns > latest.end_ns:
                latest = row
    return pd.DataFrame(found, columns=SHARED_COLUMNS)


__all__ = ["SHARED_COLUMNS", "channel_of", "exchanges", "shared_channels"]
