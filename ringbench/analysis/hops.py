"""Hops: per ordered pair src -> dst, the transfer itself apart from the wait for the upstream rank.

A receiver's ``recv`` span runs from its post to the block being in hand. Part of that is not the link's fault:
the block cannot leave ``src`` before ``src`` posted its send (the sender's ``send`` start). So, per transfer,

    transfer_start  = max(recv_start on dst, send_start on src)
    transfer_ms     = recv_end - transfer_start                 (the link's latency for this block)
    upstream_wait_ms = max(0, send_start on src - recv_start on dst)   (dst waited for a late sender)
    bandwidth       = bytes / transfer_ms

(ringbench/metrics.py defines transfer_ms and bandwidth; this module matches the spans they are computed from.)
Blaming the link for the whole recv span (``recv_ms``) is the classic mistake: behind a slow rank, every
downstream link looks slow. Sends and recvs of one exchange share (case, repeat, iteration, phase, step, src, dst);
when a step carries several exchanges (the backward's K/V and dK/dV), the k-th send matches the k-th recv in
posting order (``ordinal``), and the k-th wait of the receiver too.

``exchange`` names what moved: ``kv`` (the K/V block) or, in the backward, ``dkv`` (the dK/dV accumulator). The
engine posts K/V before a step's compute and dK/dV after it, and labels both with the posting step, so the last
exchange of a backward step is always dK/dV (sync or double; at step N-1 (double) or 0 (sync) it is the only
one). Hop statistics are kept per exchange: the two differ in bytes (bf16 blocks, fp32 accumulators) and in
what they wait for. ``collective`` rows (the all-gather baseline) are not hops and have no transfer rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ringbench.metrics import bandwidth_gbps, transfer_window

STEP_KEYS = ["case_id", "repeat", "iteration", "phase", "step"]
LINK_KEYS = [*STEP_KEYS, "src", "dst", "ordinal"]
EXCHANGES = ("kv", "dkv")

TRANSFER_COLUMNS = [
    *LINK_KEYS,
    "exchange",
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
    "exchange",
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
    start, transfer_ms, upstream_ms = transfer_window(out["recv_start_ns"], out["recv_end_ns"], out["send_start_ns"])
    out["transfer_start_ns"] = start
    out["recv_ms"] = (out["recv_end_ns"] - out["recv_start_ns"]) / 1e6
    out["transfer_ms"] = transfer_ms
    out["upstream_wait_ms"] = upstream_ms
    out["wait_ms"] = ((out["wait_end_ns"] - out["wait_start_ns"]) / 1e6).fillna(0.0)
    out["exchange"] = exchange_kind(out)
    return out[TRANSFER_COLUMNS].reset_index(drop=True)


def exchange_kind(rows: pd.DataFrame) -> np.ndarray:
    """``kv`` or ``dkv`` per transfer row: in the backward the last exchange posted in a step is dK/dV."""
    if rows.empty:
        return np.array([], dtype=object)
    last = rows.groupby([*STEP_KEYS, "src", "dst"], observed=True, sort=False)["ordinal"].transform("max")
    is_dkv = (rows["phase"].to_numpy() == "bwd") & (rows["ordinal"].to_numpy() == last.to_numpy())
    return np.where(is_dkv, "dkv", "kv").astype(object)


def hop_table(xfers: pd.DataFrame) -> pd.DataFrame:
    """Per (case, phase, exchange, src -> dst): medians of the naive recv time, the upstream wait and the transfer
    itself, with the transfer's p10/p90 and the achieved bandwidth (median bytes / median transfer time, GB/s)."""
    if xfers.empty:
        return pd.DataFrame(columns=HOP_COLUMNS)
    keys = ["case_id", "phase", "exchange", "src", "dst"]
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
    out["bandwidth_gbps"] = bandwidth_gbps(out["bytes"], out["transfer_ms"])
    return out.reset_index()[HOP_COLUMNS]


def hop_matrix(hops: pd.DataFrame, case_id: str, phase: str = "fwd", value: str = "transfer_ms") -> pd.DataFrame:
    """src x dst matrix of one hop statistic for one case and phase, K/V exchanges (NaN where the ring has no hop)."""
    rows = hops[(hops["case_id"] == case_id) & (hops["phase"] == phase)]
    if rows.empty:
        rows = hops[hops["case_id"] == case_id]
        rows = rows[rows["phase"] == rows["phase"].iloc[0]] if not rows.empty else rows
    if "exchange" in rows and (rows["exchange"] == "kv").any():
        rows = rows[rows["exchange"] == "kv"]
    ranks = sorted(set(rows["src"]) | set(rows["dst"]))
    matrix = rows.pivot_table(index="src", columns="dst", values=value, aggfunc="median", observed=True)
    return matrix.reindex(index=ranks, columns=ranks)
