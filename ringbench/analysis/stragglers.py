"""Stragglers: the critical path of each iteration across all ranks, and which rank or link held the ring back.

Critical path. A rank is blocked only by its own compute or by a wait for an exchange. Walking back in time from
the rank that finished the iteration last, at cursor (rank r, time t) take the latest blocking span of r ending by t:

  compute [cs, ce]   -> rank r is on the path for ce - cs; continue at (r, cs)
  wait    [ws, we]   -> the exchange that ended it is the later of r's recv (from the predecessor) and r's own
                        send (to the successor) that completed by we. Its link is on the path for
                        transfer_ms = end - max(post on r, post on the peer). If the peer posted later than r, r was
                        waiting for the peer (upstream, not the link): continue on the peer at its post time;
                        otherwise continue at (r, post on r).

Gaps between spans and wait tails after the completion stamp are ``other``. Each move goes back at least one span,
so the walk loops over ring steps (vectorised over iterations), never over events.

Verdict. Per rank, compute time per unit of work (ms per GFLOP from the ``flops`` column, so that the mask plan's
uneven work is not mistaken for slowness); per link, transfer time per MB. Each is compared with the median of its
peers (the other ranks, the other links) after taking medians over iterations, so one noisy span cannot raise an
alarm: flagged when ratio >= 1 + margin. The cost of a flagged resource to the ring, per iteration, is the time it
spends on the critical path times (1 - 1/ratio): what the path would shrink by at its peers' speed. The culprit of
a case is the flagged resource with the largest cost (a slow link hidden behind compute costs ~0 but is still named).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ringbench.analysis.hops import STEP_KEYS, transfers

GROUP_KEYS = ["case_id", "repeat", "iteration"]
CRITICAL_PATH_COLUMNS = [*GROUP_KEYS, "resource", "rank", "src", "dst", "ms", "path_ms"]
STRAGGLER_COLUMNS = [
    "case_id",
    "resource",
    "rank",
    "src",
    "dst",
    "unit",
    "unit_time",
    "peer_unit_time",
    "ratio",
    "cp_ms",
    "cp_share",
    "cost_ms",
    "cost_ms_p10",
    "cost_ms_p90",
    "flagged",
]
CULPRIT_COLUMNS = [
    "case_id",
    "straggler_kind",
    "straggler_rank",
    "slow_hop_src",
    "slow_hop_dst",
    "ratio",
    "cost_ms",
    "cost_ms_p10",
    "cost_ms_p90",
    "cp_share",
    "worst_rank",
    "worst_rank_ratio",
    "worst_hop_src",
    "worst_hop_dst",
    "worst_hop_ratio",
]
RANK_MARGIN = 0.25  # a compute straggler is >= 25% slower per FLOP than the median of the other ranks
LINK_MARGIN = 0.20  # a slow link is >= 20% slower per byte than the median of the other links
_TIME_BITS = 40  # sort key = (group-rank << 40) | time in ns since the iteration began (~18 min of headroom)


def _elements(events: pd.DataFrame, xfers: pd.DataFrame, origin: pd.Series, width: int, tol_ns: int):
    """The blocking spans of every (iteration, rank), sorted by end, with where the walk continues after each."""
    index = origin.index

    def group_of(frame: pd.DataFrame) -> np.ndarray:
        return index.get_indexer(pd.MultiIndex.from_frame(frame[GROUP_KEYS]))

    comp = events.loc[events["kind"] == "compute", [*GROUP_KEYS, "rank", "start_ns", "end_ns"]]
    g = group_of(comp)
    rank = comp["rank"].to_numpy(np.int64)
    parts = [
        {
            "g": g,
            "rank": rank,
            "start": comp["start_ns"].to_numpy(np.int64),
            "end": comp["end_ns"].to_numpy(np.int64),
            "kind": np.zeros(len(comp), np.int8),
            "link_src": np.full(len(comp), -1),
            "link_dst": np.full(len(comp), -1),
            "link_ms": np.zeros(len(comp)),
            "link_end": comp["end_ns"].to_numpy(np.int64),
            "next_rank": rank,
            "next_t": comp["start_ns"].to_numpy(np.int64),
        }
    ]
    waits = xfers[xfers["wait_ms"] > 0].rename(columns={"dst": "rank", "src": "pred"})
    outgoing = xfers[[*STEP_KEYS, "ordinal", "src", "dst", "send_start_ns", "send_end_ns", "recv_start_ns"]].rename(
        columns={"src": "rank", "dst": "succ", "recv_start_ns": "succ_post_ns"}
    )
    waits = (
        waits.rename(columns={"send_start_ns": "pred_post_ns"})
        .drop(columns="send_end_ns")
        .merge(outgoing, on=[*STEP_KEYS, "ordinal", "rank"], how="left")
    )
    if len(waits):
        we = waits["wait_end_ns"].to_numpy(float)
        re, rs = waits["recv_end_ns"].to_numpy(float), waits["recv_start_ns"].to_numpy(float)
        tr = waits["transfer_start_ns"].to_numpy(float)
        ps = waits["pred_post_ns"].to_numpy(float)
        se, ss = waits["send_end_ns"].to_numpy(float), waits["send_start_ns"].to_numpy(float)
        succ_post = waits["succ_post_ns"].to_numpy(float)
        # The send binds only if it completed after the recv and still before the wait ended.
        by_send = np.nan_to_num(se, nan=-np.inf) > re
        by_send &= np.nan_to_num(se, nan=np.inf) <= we + tol_ns
        to = np.fmax(ss, succ_post)
        own = waits["rank"].to_numpy(np.int64)
        pred, succ = waits["pred"].to_numpy(np.int64), waits["succ"].fillna(-1).to_numpy(np.int64)
        upstream_in = np.nan_to_num(ps, nan=-np.inf) > rs  # the predecessor posted after us: we waited on it
        upstream_out = np.nan_to_num(succ_post, nan=-np.inf) > ss
        link_end = np.where(by_send, se, re)
        next_t = np.where(by_send, np.where(upstream_out, succ_post, ss), np.where(upstream_in, ps, rs))
        parts.append(
            {
                "g": group_of(waits),
                "rank": own,
                "start": waits["wait_start_ns"].to_numpy(np.int64),
                "end": we.astype(np.int64),
                "kind": np.ones(len(waits), np.int8),
                "link_src": np.where(by_send, own, pred),
                "link_dst": np.where(by_send, succ, own),
                "link_ms": np.clip(np.where(by_send, se - to, re - tr) / 1e6, 0.0, None),
                "link_end": link_end.astype(np.int64),
                "next_rank": np.where(by_send, np.where(upstream_out, succ, own), np.where(upstream_in, pred, own)),
                "next_t": np.minimum(next_t, link_end).astype(np.int64),
            }
        )
    el = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    base = origin.to_numpy(np.int64)[el["g"]]
    for key in ("start", "end", "link_end", "next_t"):
        el[key] = np.clip(el[key] - base, 0, (1 << _TIME_BITS) - 1)
    el["gr"] = el["g"] * width + el["rank"]
    el["key"] = (el["gr"] << _TIME_BITS) | el["end"]
    order = np.argsort(el["key"], kind="stable")
    return {key: value[order] for key, value in el.items()}


def critical_path(events: pd.DataFrame, xfers: pd.DataFrame | None = None, tol_ns: int = 20_000) -> pd.DataFrame:
    """Per iteration, the ms of the critical path spent on each rank's compute, on each link, and elsewhere.

    ``tol_ns`` absorbs clock-alignment residue between ranks. Dense: every rank and link of the case appears in
    every iteration (0 ms when off the path); ``path_ms`` is the iteration's length from its first span.
    """
    if xfers is None:
        xfers = transfers(events)
    steps = events[events["kind"].isin(["compute", "wait"])]
    if steps.empty:
        return pd.DataFrame(columns=CRITICAL_PATH_COLUMNS)
    origin = events.groupby(GROUP_KEYS, observed=True, sort=True)["start_ns"].min()
    width = int(events["rank"].max()) + 1
    el = _elements(events, xfers, origin, width, tol_ns)

    # Start each walk at the rank whose last blocking span ends last in the iteration.
    last = np.r_[np.nonzero(np.diff(el["gr"]))[0], len(el["gr"]) - 1]  # last element of each (g, rank)
    by_g = pd.DataFrame({"g": el["g"][last], "end": el["end"][last], "gr": el["gr"][last]})
    start = by_g.loc[by_g.groupby("g")["end"].idxmax()]
    cur_gr, t = start["gr"].to_numpy(np.int64).copy(), start["end"].to_numpy(np.int64).copy()
    walk_g = start["g"].to_numpy(np.int64)
    path_ns = t.copy()
    contributions: list[tuple[np.ndarray, ...]] = []
    active = np.ones(len(cur_gr), bool)
    for _ in range(4 * int(np.bincount(el["gr"]).max()) + 16):
        idx = np.searchsorted(el["key"], (cur_gr << _TIME_BITS) + t + tol_ns, side="right") - 1
        for _retry in range(4):  # the span must begin before the cursor, or the walk would not move back
            idx_c = np.clip(idx, 0, None)
            ok = active & (idx >= 0) & (el["gr"][idx_c] == cur_gr)
            back = ok & (el["start"][idx_c] >= t)
            if not back.any():
                break
            idx = np.where(back, idx - 1, idx)
        active = ok & (el["start"][idx_c] < t)
        if not active.any():
            break
        sel, e = np.nonzero(active)[0], idx_c[active]
        is_compute = el["kind"][e] == 0
        dur_ms = np.where(is_compute, (el["end"][e] - el["start"][e]) / 1e6, el["link_ms"][e])
        contributions.append((walk_g[sel], is_compute, el["rank"][e], el["link_src"][e], el["link_dst"][e], dur_ms))
        next_gr = walk_g[sel] * width + el["next_rank"][e]
        next_t = el["next_t"][e]
        stuck = (next_gr == cur_gr[sel]) & (next_t >= t[sel])
        cur_gr[sel], t[sel] = next_gr, next_t
        active[sel[stuck]] = False
    return _dense_path(events, xfers, origin, walk_g, path_ns, contributions)


def _dense_path(events, xfers, origin, walk_g, path_ns, contributions) -> pd.DataFrame:
    groups = origin.index.to_frame(index=False)
    groups["g"] = np.arange(len(groups))
    path = pd.DataFrame({"g": walk_g, "path_ms": path_ns / 1e6})
    if contributions:
        cols = [np.concatenate(c) for c in zip(*contributions, strict=True)]
        c = pd.DataFrame(dict(zip(["g", "is_compute", "rank", "src", "dst", "ms"], cols, strict=True)))
    else:
        c = pd.DataFrame({"g": [], "is_compute": [], "rank": [], "src": [], "dst": [], "ms": []})
    ranks = c[c["is_compute"].astype(bool)].groupby(["g", "rank"], as_index=False)["ms"].sum()
    links = c[~c["is_compute"].astype(bool)].groupby(["g", "src", "dst"], as_index=False)["ms"].sum()
    # Dense: every (iteration, rank of its case) and (iteration, link of its case), 0 ms when off the path.
    case_ranks = events[["case_id", "rank"]].drop_duplicates()
    case_links = xfers[["case_id", "src", "dst"]].drop_duplicates()
    dense_r = groups.merge(case_ranks, on="case_id").merge(ranks, on=["g", "rank"], how="left")
    dense_r = dense_r.assign(resource="rank", src=-1, dst=-1)
    dense_l = groups.merge(case_links, on="case_id").merge(links, on=["g", "src", "dst"], how="left")
    dense_l = dense_l.assign(resource="link", rank=-1)
    out = pd.concat([dense_r, dense_l], ignore_index=True)
    out["ms"] = out["ms"].fillna(0.0)
    out = out.merge(path, on="g", how="left")
    other = out.groupby("g", as_index=False).agg(ms=("ms", "sum"), path_ms=("path_ms", "first"))
    other["ms"] = (other["path_ms"] - other["ms"]).clip(lower=0.0)
    other = groups.merge(other, on="g").assign(resource="other", rank=-1, src=-1, dst=-1)
    out = pd.concat([out, other], ignore_index=True).sort_values(["g", "resource", "rank", "src", "dst"])
    return out.astype({"rank": "int64", "src": "int64", "dst": "int64"})[CRITICAL_PATH_COLUMNS].reset_index(drop=True)


def _peer_ratio(table: pd.DataFrame, value: str) -> pd.Series:
    """value / median of the same value over the *other* members of its (case, phase) group."""
    ratio = pd.Series(np.nan, index=table.index)
    for _, group in table.groupby(["case_id", "phase"], observed=True):
        values = group[value].to_numpy(float)
        if len(values) < 2:
            continue
        peers = np.array([np.nanmedian(np.delete(values, i)) for i in range(len(values))])
        ratio.loc[group.index] = np.where(peers > 0, values / peers, np.nan)
    return ratio


def _unit_times(events: pd.DataFrame, xfers: pd.DataFrame) -> pd.DataFrame:
    """Per case and resource: median unit time (compute ms/GFLOP, transfer ms/MB) and its ratio to the peers."""
    comp = events.loc[events["kind"] == "compute", ["case_id", "phase", "rank", "start_ns", "end_ns", "flops"]]
    work = comp["flops"].where(comp["flops"] > 0) / 1e9
    comp = comp.assign(unit_time=((comp["end_ns"] - comp["start_ns"]) / 1e6 / work.fillna(1.0)))
    comp = comp.assign(unit=np.where(work.notna(), "ms/GFLOP", "ms"))
    ranks = comp.groupby(["case_id", "phase", "rank"], observed=True, as_index=False).agg(
        unit_time=("unit_time", "median"), unit=("unit", "first")
    )
    size = xfers["bytes"].where(xfers["bytes"] > 0) / 1e6
    links = xfers.assign(unit_time=xfers["transfer_ms"] / size.fillna(1.0), unit=np.where(size.notna(), "ms/MB", "ms"))
    links = links.groupby(["case_id", "phase", "src", "dst"], observed=True, as_index=False).agg(
        unit_time=("unit_time", "median"), unit=("unit", "first")
    )
    frames = []
    for resource, table, keys in (("rank", ranks, ["rank"]), ("link", links, ["src", "dst"])):
        table = table.assign(ratio=_peer_ratio(table, "unit_time"))
        table["peer_unit_time"] = table["unit_time"] / table["ratio"]
        # Phases (fwd, bwd) differ in speed for every rank alike; combine their ratios after normalising.
        agg = table.groupby(["case_id", *keys], observed=True, as_index=False).agg(
            unit=("unit", "first"),
            unit_time=("unit_time", "median"),
            peer_unit_time=("peer_unit_time", "median"),
            ratio=("ratio", "mean"),
        )
        frames.append(agg.assign(resource=resource))
    return pd.concat(frames, ignore_index=True)


def straggler_table(
    events: pd.DataFrame,
    xfers: pd.DataFrame | None = None,
    path: pd.DataFrame | None = None,
    *,
    rank_margin: float = RANK_MARGIN,
    link_margin: float = LINK_MARGIN,
) -> pd.DataFrame:
    """Per case, every rank and link: unit time against its peers, critical-path time and share, cost, flag."""
    if xfers is None:
        xfers = transfers(events)
    if path is None:
        path = critical_path(events, xfers)
    units = _unit_times(events, xfers)
    units[["rank", "src", "dst"]] = units[["rank", "src", "dst"]].fillna(-1).astype("int64")
    if path.empty or units.empty:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    keys = ["case_id", "resource", "rank", "src", "dst"]
    per_iter = path[path["resource"] != "other"].merge(units[[*keys, "ratio"]], on=keys, how="left")
    excess = (1.0 - 1.0 / per_iter["ratio"]).clip(lower=0.0).fillna(0.0)
    per_iter = per_iter.assign(cost=per_iter["ms"] * excess, share=per_iter["ms"] / per_iter["path_ms"])
    grouped = per_iter.groupby(keys, observed=True)
    cp = grouped.agg(cp_ms=("ms", "median"), cp_share=("share", "median"), cost_ms=("cost", "median"))
    cost_q = grouped["cost"].quantile([0.1, 0.9]).unstack()
    cp["cost_ms_p10"], cp["cost_ms_p90"] = cost_q[0.1], cost_q[0.9]
    out = units.merge(cp.reset_index(), on=keys, how="left")
    margin = np.where(out["resource"] == "rank", rank_margin, link_margin)
    out["flagged"] = (out["ratio"] >= 1.0 + margin).fillna(False).astype(bool)
    return out[STRAGGLER_COLUMNS].sort_values(["case_id", "resource", "rank", "src", "dst"]).reset_index(drop=True)


def culprits(table: pd.DataFrame) -> pd.DataFrame:
    """One row per case: the culprit (kind compute | link | None) with its ratio and cost, and the worst of each
    kind even when unflagged (how close the case came to an alarm)."""
    rows = []
    for case_id, group in table.groupby("case_id", sort=False):
        ranks, links = group[group["resource"] == "rank"], group[group["resource"] == "link"]
        worst_rank = ranks.loc[ranks["ratio"].idxmax()] if ranks["ratio"].notna().any() else None
        worst_link = links.loc[links["ratio"].idxmax()] if links["ratio"].notna().any() else None
        flagged = group[group["flagged"]].sort_values(["cost_ms", "ratio"], ascending=False)
        row = {c: None for c in CULPRIT_COLUMNS} | {"case_id": case_id}
        if len(flagged):
            top = flagged.iloc[0]
            row |= {key: top[key] for key in ("ratio", "cost_ms", "cost_ms_p10", "cost_ms_p90", "cp_share")}
            if top["resource"] == "rank":
                row |= {"straggler_kind": "compute", "straggler_rank": int(top["rank"])}
            else:
                row |= {"straggler_kind": "link", "slow_hop_src": int(top["src"]), "slow_hop_dst": int(top["dst"])}
        if worst_rank is not None:
            row |= {"worst_rank": int(worst_rank["rank"]), "worst_rank_ratio": float(worst_rank["ratio"])}
        if worst_link is not None:
            row |= {
                "worst_hop_src": int(worst_link["src"]),
                "worst_hop_dst": int(worst_link["dst"]),
                "worst_hop_ratio": float(worst_link["ratio"]),
            }
        rows.append(row)
    return pd.DataFrame(rows, columns=CULPRIT_COLUMNS)
