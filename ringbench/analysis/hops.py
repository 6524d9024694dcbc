"""Hops: per ordered pair src -> dst, the transfer itself apart from the wait for the upstream rank.

Transfers (``transfers``) are matched across ranks in ringbench/figures/critical_path.py, where the transfer time and the
upstream wait are defined; this module summarises them per hop: the naive recv time, the upstream wait, the
transfer itself (median, p10/p90) and the achieved bandwidth, kept apart per exchange (``kv`` / ``dkv``).
"""

from __future__ import annotations

import pandas as pd

from ringbench.figures.metrics import bandwidth_gbps

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
