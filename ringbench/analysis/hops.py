"""Hops: per ordered pair src -> dst, the transfer itself apart from the wait for the upstream rank.

A receiver's ``recv`` span runs from its post to the block being in hand. Part of that is not the link's fault:
the block cannot leave ``src`` before ``src`` posted its send (the sender's ``send`` start). So, per transfer,

    transfer_start  = max(recv_start on dst, send_start on src)
    transfer_ms     = recv_end - transfer_start                 (the link's latency for this block)
    upstream_wait_ms = max(0, send_start on src - recv_start on dst)   (dst waited for a late sender)
    bandwidth       = bytes / transfer_ms

Blaming the link for the whole recv span (``recv_ms``) is the classic mistake: behind a slow rank, every
downstream link looks slow. Sends and recvs of one exchange share (case, repeat, iteration, phase, step, src, dst);
when a step carries several exchanges (the backward's K/V and dK/dV), the k-th send matches the k-th recv in
posting order (``ordinal``), and the k-th wait of the receiver too.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

STEP_KEYS = ["case_id", "repeat", "iteration", "phase", "step"]
LINK_KEYS = [*STEP_KEYS, "src", "dst", "ordinal"]

TRANSFER_COLUMNS = [
    *LINK_KEYS,
    "bytes",
    "send_start_ns",
    "send_end_ns",
    "recv_start_ns",
    "recv_end_ns",
    "wait_start_ns",
    "wait_end_ns",
    "transfer_start_ns",
    "recv_ms",
    "transfer_ms",
    "upstream_wait_ms",
    "wait_ms",
]
HOP_COLUMNS = [
    "case_id",
    "phase",
    "src",
    "dst",
    "transfers",
    "bytes",
    "recv_ms",
    "upstream_wait_ms",
    "transfer_ms",
    "transfer_ms_p10",
    "transfer_ms_p90",
    "bandwidth_gbps",
]


def _spans(events: pd.DataFrame, kind: str, prefix: str) -> pd.DataFrame:
    """Rows of one kind with an ordinal in posting order within (step keys, src, dst)."""
    rows = events.loc[events["kind"] == kind, [*STEP_KEYS, "src", "dst", "start_ns", "end_ns", "bytes"]]
    rows = rows.sort_values("start_ns", kind="stable")
    rows["ordinal"] = rows.groupby([*STEP_KEYS, "src", "dst"], sort=False, observed=True).cumcount()
    return rows.rename(
        columns={"start_ns": f"{prefix}_start_ns", "end_ns": f"{prefix}_end_ns", "bytes": f"{prefix}_bytes"}
    )


def transfers(events: pd.DataFrame) -> pd.DataFrame:
    """One row per received block: the receiver's recv and wait matched with the sender's send.

    A recv without a matching send (a truncated record) keeps NaN send times and is treated as posted in time.
    """
    recvs = _spans(events, "recv", "recv")
    sends = _spans(events, "send", "send").drop(columns="send_bytes")
    waits = _spans(events, "wait", "wait").drop(columns="wait_bytes")
    out = recvs.merge(sends, on=LINK_KEYS, how="left").merge(waits, on=LINK_KEYS, how="left")
    out = out.rename(columns={"recv_bytes": "bytes"})
    recv_start = out["recv_start_ns"].to_numpy(dtype=float)
    send_start = out["send_start_ns"].to_numpy(dtype=float)
    start = np.fmax(recv_start, send_start)  # fmax: a missing send start means "posted in time"
    out["transfer_start_ns"] = start
    out["recv_ms"] = (out["recv_end_ns"] - out["recv_start_ns"]) / 1e6
    out["transfer_ms"] = np.clip((out["recv_end_ns"].to_numpy(dtype=float) - start) / 1e6, 0.0, None)
    out["upstream_wait_ms"] = np.clip(np.nan_to_num(send_start - recv_start) / 1e6, 0.0, None)
    out["wait_ms"] = ((out["wait_end_ns"] - out["wait_start_ns"]) / 1e6).fillna(0.0)
    return out[TRANSFER_COLUMNS].reset_index(drop=True)


def hop_table(xfers: pd.DataFrame) -> pd.DataFrame:
    """Per (case, phase, src -> dst): medians of the naive recv time, the upstream wait and the transfer itself,
    with the transfer's p10/p90 and the achieved bandwidth (median bytes / median transfer time, GB/s)."""
    if xfers.empty:
        return pd.DataFrame(columns=HOP_COLUMNS)
    keys = ["case_id", "phase", "src", "dst"]
    grouped = xfers.groupby(keys, observed=True, sort=True)
    out = grouped.agg(
        transfers=("transfer_ms", "size"),
        bytes=("bytes", "median"),
        recv_ms=("recv_ms", "median"),
        upstream_wait_ms=("upstream_wait_ms", "median"),
        transfer_ms=("transfer_ms", "median"),
    )
    quantiles = grouped["transfer_ms"].quantile([0.1, 0.9]).unstack()
    out["transfer_ms_p10"] = quantiles[0.1]
    out["transfer_ms_p90"] = quantiles[0.9]
    seconds = out["transfer_ms"].where(out["transfer_ms"] > 0) / 1e3
    out["bandwidth_gbps"] = out["bytes"] / seconds / 1e9
    return out.reset_index()[HOP_COLUMNS]


def hop_matrix(hops: pd.DataFrame, case_id: str, phase: str = "fwd", value: str = "transfer_ms") -> pd.DataFrame:
    """src x dst matrix of one hop statistic for one case and phase (NaN where the ring has no hop)."""
    rows = hops[(hops["case_id"] == case_id) & (hops["phase"] == phase)]
    if rows.empty:
        rows = hops[hops["case_id"] == case_id]
        rows = rows[rows["phase"] == rows["phase"].iloc[0]] if not rows.empty else rows
    ranks = sorted(set(rows["src"]) | set(rows["dst"]))
    matrix = rows.pivot_table(index="src", columns="dst", values=value, aggfunc="median", observed=True)
    return matrix.reindex(index=ranks, columns=ranks)
