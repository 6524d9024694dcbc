"""The cases that matter, in detail: which cases get a section of their own, and what each section holds.

A sweep of dozens of cases cannot show every case's figures, and the first case is often one that cannot be
judged (real compute on an oversubscribed CPU). So the sections show, at most ``MAX_SECTIONS``: the headline
straggler's case, the fastest and the slowest, and one case per value of each varied axis -- chosen among the
cases that could be judged (confidence ``conclusive``); when none could, among those whose step times can be
trusted (answers.TIMING_REASONS), and the section says so. Each holds the case's timeline (one panel per phase),
the ring, its hops in ring order, compute vs wait per rank -- the culprit marked in every one -- and its tables:
ranks and links against their peers, hops, balance.
"""

from __future__ import annotations

import pandas as pd

from ringbench.analysis.answers import TIMING_REASONS
from ringbench.analysis.findings import RunAnalysis, straggler_sentence
from ringbench.analysis.stragglers import (
    CONSISTENCY,
    LINK_MARGIN,
    LINK_MIN_EXCESS,
    MIN_EXTRA_SHARE,
    RANK_MARGIN,
    UNIT_QUANTILE,
)
from ringbench.report import case_charts
from ringbench.report.charts import Culprit, Png
from ringbench.report.model import Cases, Section, Table, culprit_text, fmt, ring_of, table

MAX_SECTIONS = 6
TITLE = "Cases in detail"


def _pool(analysis: RunAnalysis, frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The cases sections may show, and a sentence on what they are."""
    traced = frame[frame["traced"].fillna(False).astype(bool)]
    judged = traced[traced["judged"]]
    if len(judged):
        left = len(traced) - len(judged)
        rest = f"; {left} could not be judged (see the cases table)" if left else ""
        return judged, f"Chosen among the {len(judged)} case(s) that could be judged{rest}."
    confidence = analysis.confidence
    trusted = set()
    if confidence is not None and len(confidence):
        trusted = {str(cid) for cid, codes in zip(confidence["case_id"], confidence["reason_codes"], strict=True)
                   if not set(codes or ()) & set(TIMING_REASONS)}  # fmt: skip
    fair = traced[traced["case_id"].isin(trusted)]
    if len(fair):
        return fair, (
            "No case could be judged, so no rank or hop is named in these sections; they show cases whose step "
            "times can be trusted."
        )
    return traced, (
        "No case could be judged and no case's step times can be trusted (see the verdict): these sections show "
        "the timings as recorded, not as evidence."
    )


def choose(analysis: RunAnalysis, cases: Cases) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """[(case id, why it is shown)] in the order of the sections, and notes on the choice."""
    pool, sentence = _pool(analysis, cases.frame)
    if pool.empty:
        return [], ["No case has per-step spans (run --no-trace?), so there are no per-case figures."]
    picks: dict[str, list[str]] = {}
    top = analysis.headline()
    if top is not None and str(top["case_id"]) in set(pool["case_id"]):
        picks[str(top["case_id"])] = [f"headline culprit: {culprit_text(top)}"]
    timed = pool[pool["step_ms"].notna()].sort_values(["step_ms", "number"], kind="stable")
    if len(timed) > 1:
        picks.setdefault(str(timed["case_id"].iloc[0]), []).append("fastest")
        picks.setdefault(str(timed["case_id"].iloc[-1]), []).append("slowest")
    elif not picks:
        picks.setdefault(str((timed if len(timed) else pool)["case_id"].iloc[0]), []).append("the only one")
    notes = [sentence]
    missing = []
    ordered = pd.concat([timed, pool[pool["step_ms"].isna()]])
    for axis in cases.varied:
        for value in dict.fromkeys(cases.frame[axis].astype(str)):
            chosen = ordered[ordered["case_id"].isin(picks)]
            if (chosen[axis].astype(str) == value).any():
                continue
            candidates = ordered[ordered[axis].astype(str) == value]
            if candidates.empty:
                missing.append(f"{axis} = {value}")
                continue
            picks.setdefault(str(candidates["case_id"].iloc[0]), []).append(f"{axis} = {value}")
    if missing:
        notes.append("No case with " + ", ".join(missing) + " is among them.")
    shown = list(picks.items())[:MAX_SECTIONS]
    if len(picks) > MAX_SECTIONS:
        notes.append(f"{len(picks) - MAX_SECTIONS} more case(s) would qualify; at most {MAX_SECTIONS} are shown.")
    return shown, notes


def _culprit(row: pd.Series) -> Culprit:
    if row["straggler_kind"] == "compute":
        return Culprit(rank=int(row["straggler_rank"]))
    if row["straggler_kind"] == "link":
        return Culprit(hop=(int(row["slow_hop_src"]), int(row["slow_hop_dst"])))
    return Culprit()


def case_sections(analysis: RunAnalysis, cases: Cases) -> Section:
    """The parent section (its lines say how the cases were chosen) with one child section per case."""
    picks, notes = choose(analysis, cases)
    children = tuple(_case_section(analysis, cases, case_id, why) for case_id, why in picks)
    return Section(TITLE, lines=tuple(notes), children=children, anchor="details")


def _lines(analysis: RunAnalysis, row: pd.Series, why: list[str], iteration: pd.DataFrame) -> list[str]:
    lines = [f"Case id: {row['case_id']}", "Shown because: " + "; ".join(why)]
    lines.append(
        f"Step time {fmt(row['step_ms'])} ms (p10 {fmt(row['step_ms_p10'])}, p90 {fmt(row['step_ms_p90'])}); "
        f"exposed communication {fmt(row['exposed_comm_frac'] * 100, '.1f')}% of the step; hidden by overlap "
        f"{fmt(row['overlap_efficiency'] * 100, '.0f')}%; imbalance {fmt(row['imbalance'])} (plan "
        f"{fmt(row['predicted_imbalance'])})"
    )
    if row["straggler_kind"] in ("compute", "link"):
        short = row.copy()
        short["case_id"] = str(row["number"])  # "in case 3": the full id is on the first line
        lines.append(straggler_sentence(short, analysis) or "")
    elif row["confidence"] == "inconclusive":
        reasons = row["inconclusive_reasons"] if isinstance(row["inconclusive_reasons"], list) else []
        lines.append("Inconclusive, nobody is named: " + "; ".join(reasons))
    else:
        lines.append("No straggler: no rank or hop crosses the alarm thresholds against its peers")
    if len(iteration):
        lines.append(
            f"Per-iteration figures show iteration {int(iteration['iteration'].iloc[0])} of repeat "
            f"{int(iteration['repeat'].iloc[0])}, the median-length one."
        )
    return lines


def _case_section(analysis: RunAnalysis, cases: Cases, case_id: str, why: list[str]) -> Section:
    row = cases.frame[cases.frame["case_id"] == case_id].iloc[0]
    number = int(row["number"])
    ring = ring_of(analysis, case_id)
    culprit = _culprit(row)
    iteration = case_charts.representative_iteration(analysis.run.events, case_id)
    stem = f"case{number}"
    drawn = [
        ("timeline", "Timeline of one iteration, one panel per phase",
         lambda: case_charts.timeline(iteration, analysis.transfers, ring, culprit), False),
        ("ring", "Ring order and hop latency",
         lambda: case_charts.ring_diagram(analysis.hops, ring, case_id, culprit), True),
        ("hops", "Transfer time per ring hop",
         lambda: case_charts.hop_bars(analysis.hops, case_id, ring, culprit), True),
        ("compute_wait", "Compute vs wait per rank",
         lambda: case_charts.compute_wait_bars(analysis.run.events, ring, case_id, culprit), True),
    ]  # fmt: skip
    pngs = []
    for name, caption, draw, half in drawn:
        data = draw()
        if data:
            pngs.append(Png(f"{stem}_{name}", f"{caption} (case {number})", data, half=half))
    return Section(
        f"Case {number}: {row['label']}",
        lines=tuple(_lines(analysis, row, why, iteration)),
        figures=tuple(pngs),
        tables=tuple(_tables(analysis, case_id, number)),
        anchor=f"case-{number}",
    )


def _verdict_rows(st: pd.DataFrame, row: pd.Series | None) -> pd.Series:
    """Per straggler-table row: "culprit" when the verdict names it (with its tied company), "alarm" when it
    crossed the thresholds but the verdict names another (a rank's links explained by the rank), else ""."""
    flagged = st["flagged"].fillna(False).astype(bool)
    named = pd.Series(False, index=st.index)
    if row is not None and row.get("straggler_kind") == "compute":
        ranks = row.get("straggler_ranks")
        ranks = list(ranks) if isinstance(ranks, (list, tuple)) or hasattr(ranks, "tolist") else []
        named = (st["resource"] == "rank") & st["rank"].isin(ranks or [int(row["straggler_rank"])])
    elif row is not None and row.get("straggler_kind") == "link":
        hops = row.get("slow_hops")
        hops = [tuple(h) for h in hops] if hops is not None and len(hops) else [(int(row["slow_hop_src"]),
                                                                                 int(row["slow_hop_dst"]))]  # fmt: skip
        named = (st["resource"] == "link") & pd.Series([(a, b) in hops for a, b in zip(st["src"], st["dst"],
                                                                                        strict=True)], index=st.index)  # fmt: skip
    return pd.Series(["culprit" if n else ("alarm" if f else "") for n, f in zip(named, flagged, strict=True)],
                     index=st.index)  # fmt: skip


def _tables(analysis: RunAnalysis, case_id: str, number: int) -> list[Table]:
    st = analysis.stragglers[analysis.stragglers["case_id"] == case_id].copy()
    summary = analysis.summary[analysis.summary["case_id"].astype(str) == str(case_id)]
    st["verdict"] = _verdict_rows(st, summary.iloc[0] if len(summary) else None)
    st["who"] = [
        f"rank {r}" if k == "rank" else f"hop {a} -> {b}"
        for k, r, a, b in zip(st["resource"], st["rank"], st["src"], st["dst"], strict=True)
    ]
    st["share_pct"] = st["cp_share"] * 100
    st["consistency_pct"] = st["consistency"] * 100
    peers = table(f"Ranks and links against their peers (case {number})", st, {
        "who": ("resource", ""),
        "unit": ("unit", ""),
        "unit_time": ("median", ".4g"),
        "peer_unit_time": ("peers' median", ".4g"),
        "ratio": ("ratio", ".2f"),
        "share_pct": ("critical path %", ".1f"),
        "cost_ms": ("cost ms/iter", ".2f"),
        "consistency_pct": ("iterations slower %", ".0f"),
        "extra_ms": ("extra ms/iter", ".2f"),
        "verdict": ("verdict", ""),
    }, f"Unit time: per iteration the p{UNIT_QUANTILE * 100:.0f} of the spans, then the median over iterations. "
       f"Flagged: ratio >= {1 + RANK_MARGIN:.2f} (ranks) or >= {1 + LINK_MARGIN:.2f} (links), slower in "
       f">= {CONSISTENCY * 100:.0f}% of iterations, extra time >= {MIN_EXTRA_SHARE * 100:.0f}% of the "
       f"iteration (links: and >= {LINK_MIN_EXCESS * 100:.0f}% of a step's compute per transfer); a flagged "
       "rank takes precedence over its links (an alarm the verdict does not name). Cost of the culprit: what its "
       "iterations save when replayed with it at its peers' speed; of the others, critical-path time x "
       "(1 - 1/ratio). Only the verdict's culprit is in red.")  # fmt: skip
    named = tuple(i for i, v in enumerate(st["verdict"]) if v == "culprit")
    peers = Table(peers.title, peers.columns, peers.rows, peers.note, highlight=named)
    hops = analysis.hops[analysis.hops["case_id"] == case_id].copy()
    order = {("fwd", "kv"): 0, ("bwd", "kv"): 1, ("bwd", "dkv"): 2}  # as they happen
    position = {rank: p for p, rank in enumerate(ring_of(analysis, case_id))}
    hops["_order"] = [order.get((p, e), 3) for p, e in zip(hops["phase"], hops["exchange"], strict=True)]
    hops["_position"] = hops["src"].map(position)
    hops = hops.sort_values(["_order", "_position"], kind="stable")
    hops["hop"] = hops["src"].astype(str) + " -> " + hops["dst"].astype(str)
    hops["mb"] = hops["bytes"] / 1e6
    hop_table = table(f"Hops (case {number}; medians)", hops, {
        "phase": ("phase", ""),
        "exchange": ("exchange", ""),
        "hop": ("hop", ""),
        "mb": ("MB", ".2f"),
        "recv_ms": ("recv ms (naive)", ".3f"),
        "upstream_wait_ms": ("upstream wait ms", ".3f"),
        "transfer_ms": ("transfer ms", ".3f"),
        "transfer_ms_p10": ("p10", ".3f"),
        "transfer_ms_p90": ("p90", ".3f"),
        "bandwidth_gbps": ("GB/s", ".2f"),
    }, "transfer = recv end - max(recv post, sender's post); upstream wait = time before the sender posted. "
       "exchange: kv = the K/V block, dkv = the backward's dK/dV accumulator.")  # fmt: skip
    bal = analysis.balance_ranks[analysis.balance_ranks["case_id"] == case_id].copy()
    bal["work_pct"], bal["time_pct"] = bal["work_share"] * 100, bal["time_share"] * 100
    planned = bool(len(bal) and bal[["full", "causal", "partial"]].fillna(0).to_numpy().sum() > 0)
    columns = {"rank": ("rank", ".0f")}
    if planned:  # an imported trace has no mask plan: no pair counts to show
        columns |= {"full": ("full", ".0f"), "causal": ("causal", ".0f"), "partial": ("partial", ".0f"),
                    "skip": ("skip", ".0f"), "gflop": ("GFLOP", ".2f")}  # fmt: skip
    columns |= {"compute_ms": ("compute ms", ".2f"), "work_pct": ("work %", ".1f"), "time_pct": ("time %", ".1f")}
    note = ("Pair counts per phase from the mask plan (skip = world - computed steps)." if planned else
            "No mask plan (an imported trace does not say which keys were masked): work % counts whole blocks.")  # fmt: skip
    balance = table(f"Balance (case {number}; per iteration, medians)", bal, columns, note)
    return [t for t in (peers, hop_table, balance) if t.rows]
