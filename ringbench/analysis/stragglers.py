"""Stragglers: the critical path of each iteration across all ranks, and which rank or link held the ring back.

Critical path: ringbench/figures/critical_path.py (the walk is part of the figures' definitions).

Verdict. Per rank, its own time per ring step per unit of work: compute spans plus ``own`` spans (work that is no
compute span: other ops and unprofiled time, found in imported traces), per GFLOP from the ``flops`` column, so
that the mask plan's uneven work is not mistaken for slowness; per link, transfer time per MB, kept apart per
phase and exchange (the backward's K/V and dK/dV, see hops.py), over measured transfers only (a censored one,
whose end is a bound, is left out). Measured spans only ever get longer than the work needs (a descheduled
thread, a late wake-up), so each resource's figure per iteration is a low quantile (``UNIT_QUANTILE``) of its
spans, and its unit time the median of that over iterations. Each is compared with the median of its peers (the
other ranks, the other links of the same phase and exchange): ``ratio = own / peers``. An alarm needs all of

  ratio >= 1 + margin                                    (RANK_MARGIN, LINK_MARGIN)
  consistency >= CONSISTENCY                              the share of iterations in which the resource alone
                                                          is that much slower than its peers in that iteration
  extra_ms >= MIN_EXTRA_SHARE of the iteration            its extra time per iteration: ranks, compute ms per
                                                          iteration x (1 - 1/ratio); links, excess x transfers
  links: excess >= LINK_MIN_EXCESS of a step's compute    excess = (own - peers) per transfer, in ms

so that a tiny, noisy run says nothing rather than something random. Hops are judged in rings of >= 3 ranks only
(``LINK_MIN_PEERS``): with 2 ranks the only other hop is the reverse direction of the same pair. A flagged rank takes precedence over the
links into and out of it (a slow rank's late posts and late stamps make its links look slow, never the reverse),
unless its cost is under RANK_EXPLAINS_LINK of the link's: then the link is a culprit of its own.
The thresholds were tuned on real 8-rank gloo runs on 2 CPU cores, where a healthy hop's low-quantile transfer
time varies by up to ~12% of a step's compute from hop to hop (benchmarks/detection_real.py). The cost of a flagged resource to the ring,
per iteration, is the time it spends on the critical path times (1 - 1/ratio): what the path would shrink by at
its peers' speed; for a link at most the time its rank sat blocked on it, since past that point the compute beside
the exchange is critical again. The ratio of a rank's cost is that of its whole iterations (own time
per iteration per unit of work against its peers'), so a delay that lands on some of its steps only is counted in
full. The culprit of a case is the flagged resource with the largest cost (a slow link hidden behind compute costs
~0 but is still named: its excess is real, only hidden).

Ties. Resources of one kind flagged in a case whose unit times lie within the measurement's resolution of the
culprit's (TIE_SHARE of it, or the spread of the unflagged peers' unit times, whichever is more) are equally to
blame: every one of them is named (``tied``), and their costs add up, since fixing one alone leaves the others on
the path.

Clock check. A block cannot be in hand before its sender posted it; when more than ``CLOCK_VIOLATION_SHARE`` of
a case's transfers complete earlier than that (by more than the clock tolerance), the ranks' clocks disagree and
link figures are meaningless: no link is flagged in that case and ``clock_violations`` says why. (The verdict goes
further: analysis/confidence.py calls such a case inconclusive and nothing in it is named; see ``no_blame``.)
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ringbench.analysis.confidence import CLOCK_VIOLATION_SHARE
from ringbench.figures.critical_path import DEFAULT_TOL_NS, GROUP_KEYS, critical_path_segments, transfers
from ringbench.figures.metrics import step_times

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
    "consistency",
    "extra_ms",
    "flagged",
    "tied",
    "ratio_p10",
    "ratio_p90",
    "cost_replayed",
    "joint_cost_ms",
    "joint_cost_ms_p10",
    "joint_cost_ms_p90",
    "structure",
    "undecided",
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
    "clock_violations",
    "straggler_ranks",
    "slow_hops",
    "ratio_p10",
    "ratio_p90",
]
RANK_MARGIN = 0.25  # a compute straggler is >= 25% slower per FLOP than the median of the other ranks
LINK_MARGIN = 0.20  # a slow link is >= 20% slower per byte than the median of the other links
UNIT_QUANTILE = 0.25  # per iteration, a resource's unit time is this quantile of its spans (noise only adds time)
UNEVEN_QUANTILE = 1.0  # ... its longest step where ranks compute unknown partial blocks (_uneven_work)
CONSISTENCY = 0.8  # ... and it must be that much slower than its peers in at least this share of iterations
MIN_EXTRA_SHARE = 0.03  # a flagged resource adds >= 3% of the iteration (what it costs the ring at most)
LINK_MIN_EXCESS = 0.15  # a flagged link's extra time per transfer is >= 15% of a step's compute (same phase)
LINK_MIN_PEERS = 2  # a hop is judged against the median of at least two other hops (rings of >= 3 ranks)
RANK_EXPLAINS_LINK = 0.5  # a flagged rank hides the links it touches only if it costs at least this share of theirs
MIN_MEASURED_ITERATIONS = 3  # a hop is judged when measured (uncensored) in this many iterations and half of them
TIE_SHARE = 0.05  # flagged resources this close (relative unit time) to the culprit are equally to blame
WORK_KINDS = ("compute", "own")  # a rank's own time: its compute and its other work
_RESOURCE_KEYS = ["case_id", "resource", "rank", "src", "dst"]  # one rank or one link of a case


def _leave_one_out_median(values: np.ndarray) -> np.ndarray:
    """Per column of a (rows, members) array: the median over the *other* members of the row (NaN-aware).

    Exact for up to 32 members; beyond that one member barely moves the median, so the whole row's is used.
    """
    members = values.shape[1]
    if members < 2:
        return np.full(values.shape, np.nan)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: NaN is the answer
        if members > 32:
            return np.repeat(np.nanmedian(values, axis=1, keepdims=True), members, axis=1)
        return np.stack([np.nanmedian(np.delete(values, i, axis=1), axis=1) for i in range(members)], axis=1)


def _ratio(values, peers) -> np.ndarray:
    values, peers = np.asarray(values, float), np.asarray(peers, float)
    out = np.full(values.shape, np.nan)
    np.divide(values, peers, out=out, where=peers > 0)
    return out


def _compare(
    spans: pd.DataFrame,
    group: list[str],
    members: list[str],
    margin: float,
    min_peers: int = 1,
    quantile: float = UNIT_QUANTILE,
) -> pd.DataFrame:
    """Per (group, member): unit time (median over iterations of the per-iteration low quantile of its spans),
    the peers' median, the ratio, and the share of iterations in which it alone was >= 1 + margin slower.
    With fewer than ``min_peers`` other members there is no baseline: ratio and consistency are NaN."""
    columns = [*group, *members, "unit_time", "peer_unit_time", "ratio", "consistency", "ratio_p10", "ratio_p90"]
    if spans.empty:
        return pd.DataFrame(columns=columns)
    spans = spans.astype({"unit_time": float})
    iter_keys = [*group, "repeat", "iteration"]
    per_iter = spans.groupby([*iter_keys, *members], observed=True)["unit_time"].quantile(quantile)
    overall = per_iter.groupby(level=[*group, *members], observed=True).median()
    frames = []
    for key, block in overall.groupby(level=group, observed=True, sort=False):
        wide = block.reset_index(level=group, drop=True)
        values = wide.to_numpy(float)[None, :]
        peers = _leave_one_out_median(values)[0]
        frame = wide.reset_index()
        frame["peer_unit_time"] = peers
        frame["ratio"] = _ratio(wide.to_numpy(float), peers) if len(wide) > min_peers else np.nan
        key = key if isinstance(key, tuple) else (key,)
        for name, value in zip(group, key, strict=True):
            frame[name] = value
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=columns)
    out = pd.concat(frames, ignore_index=True)
    # Consistency: per iteration, the member against its peers of the same iteration.
    wide = per_iter.unstack(members)
    values = wide.to_numpy(float)
    groups = wide.index.droplevel(["repeat", "iteration"])
    slower = np.zeros(values.shape, bool)
    ratios = np.full(values.shape, np.nan)
    for key in groups.unique():
        rows = np.asarray(groups == key)
        block = values[rows]
        ratios[rows] = _ratio(block, _leave_one_out_median(block))
        slower[rows] = ratios[rows] >= 1.0 + margin
    observed = ~np.isnan(values)
    hits = pd.DataFrame(slower & observed, index=wide.index, columns=wide.columns).groupby(level=group).sum()
    seen = pd.DataFrame(observed, index=wide.index, columns=wide.columns).groupby(level=group).sum()
    share = (hits / seen.where(seen > 0)).stack(list(range(len(members))), future_stack=True).rename("consistency")
    out = out.merge(share.reset_index(), on=[*group, *members], how="left")
    # The ratio's interval: its p10 and p90 over iterations (each iteration's ratio against that iteration's peers).
    per = pd.DataFrame(ratios, index=wide.index, columns=wide.columns).groupby(level=group)
    stacked = [per.quantile(q).stack(list(range(len(members))), future_stack=True).rename(name)
               for q, name in ((0.1, "ratio_p10"), (0.9, "ratio_p90"))]  # fmt: skip
    out = out.merge(pd.concat(stacked, axis=1).reset_index(), on=[*group, *members], how="left")
    if min_peers > 1 and len(out):
        few = out["ratio"].isna()
        out.loc[few, ["ratio_p10", "ratio_p90"]] = np.nan
    return out


def rank_steps(events: pd.DataFrame) -> pd.DataFrame:
    """Per (case, repeat, iteration, phase, step, rank): the rank's own ms (compute + own spans), its compute ms
    and its FLOPs. Steps without a compute span are kept (their own time counts per iteration)."""
    keys = ["case_id", "repeat", "iteration", "phase", "step", "rank"]
    work = events.loc[events["kind"].isin(WORK_KINDS), [*keys, "kind", "start_ns", "end_ns", "flops"]]
    ms = (work["end_ns"] - work["start_ns"]) / 1e6
    work = work.assign(ms=ms, compute_ms=ms.where(work["kind"] == "compute", 0.0),
                       computes=(work["kind"] == "compute").astype(int), flops=work["flops"].fillna(0.0))  # fmt: skip
    return work.groupby(keys, observed=True)[["ms", "compute_ms", "flops", "computes"]].sum().reset_index()


def _unit_times(events: pd.DataFrame, xfers: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per case, phase (and exchange) and resource: unit time (own ms/GFLOP per step, transfer ms/MB), the peers'
    median, ratio, consistency; ranks also carry ``cost_ratio`` (whole iterations), links their median MB and
    transfers per iteration. ``steps``: rank_steps(events) when already computed."""
    steps = rank_steps(events) if steps is None else steps
    has_work = steps.groupby("case_id", observed=True)["flops"].transform("max") > 0
    work = steps["flops"].where(steps["flops"] > 0) / 1e9
    judged = steps[(steps["computes"] > 0) & (~has_work | work.notna())]
    judged = judged.assign(unit_time=judged["ms"] / work.reindex(judged.index).fillna(1.0), exchange="")
    uneven = _uneven_work(events, steps)
    parts = [_compare(judged[judged["case_id"].isin(uneven) == flag], ["case_id", "phase", "exchange"], ["rank"],
                      RANK_MARGIN, quantile=UNEVEN_QUANTILE if flag else UNIT_QUANTILE)
             for flag in (False, True) if (judged["case_id"].isin(uneven) == flag).any()]  # fmt: skip
    ranks = pd.concat(parts, ignore_index=True) if parts else _compare(judged, ["case_id", "phase", "exchange"],
                                                                       ["rank"], RANK_MARGIN)  # fmt: skip
    unit = judged.assign(unit=np.where(has_work.reindex(judged.index), "ms/GFLOP", "ms")).groupby("case_id")["unit"]
    ranks["unit"] = unit.first().reindex(ranks["case_id"]).to_numpy()
    ranks["mb"] = np.nan
    ranks["per_iteration"] = np.nan
    ranks = ranks.merge(_iteration_ratio(steps), on=["case_id", "phase", "rank"], how="left")
    iters = xfers.groupby(["case_id"], observed=True)[["repeat", "iteration"]].apply(lambda f: len(f.drop_duplicates()))
    size = xfers["bytes"].where(xfers["bytes"] > 0) / 1e6
    every = xfers.assign(unit_time=xfers["transfer_ms"] / size.fillna(1.0), mb=size)
    moved = every[~every["censored"].astype(bool)] if "censored" in every else every
    # Two ranks have two hops, both directions between the same pair: one other hop is no baseline.
    links = _compare(moved, ["case_id", "phase", "exchange"], ["src", "dst"], LINK_MARGIN, min_peers=LINK_MIN_PEERS)
    if len(moved) < len(every):
        links = _bounded_peers(links, every)
    hop_keys = ["case_id", "phase", "exchange", "src", "dst"]
    if len(links):
        stats = moved.groupby(hop_keys, observed=True).agg(mb=("mb", "median"), n=("mb", "size"))
        stats["per_iteration"] = stats["n"] / iters.reindex(stats.index.get_level_values("case_id")).to_numpy()
        links = links.merge(stats.drop(columns="n").reset_index(), on=hop_keys, how="left")
        links["unit"] = np.where(links["mb"].notna(), "ms/MB", "ms")
    else:
        links = links.assign(unit="ms/MB", mb=np.nan, per_iteration=np.nan)
    if len(links):  # judged on measured transfers in enough iterations (censored ones left out), else not at all
        seen = moved.groupby(hop_keys, observed=True)[["repeat", "iteration"]].apply(lambda f: len(f.drop_duplicates()))
        needed = np.maximum(MIN_MEASURED_ITERATIONS, np.ceil(0.5 * iters.reindex(links["case_id"]).to_numpy(float)))
        enough = seen.reindex(pd.MultiIndex.from_frame(links[hop_keys])).to_numpy(float) >= needed
        links.loc[~enough, ["ratio", "consistency"]] = np.nan
    links["cost_ratio"] = links["ratio"]
    return pd.concat([ranks.assign(resource="rank"), links.assign(resource="link")], ignore_index=True)


def _floor_links(units: pd.DataFrame, floor_ms: float) -> None:
    """Links' peers' baseline at least ``floor_ms`` per transfer (straggler_table); ratio and interval follow."""
    is_link = (units["resource"] == "link").to_numpy()
    per_mb = floor_ms / units["mb"].where(units["mb"] > 0).fillna(1.0)
    peer = units["peer_unit_time"].to_numpy(float)
    floored = np.where(is_link, np.fmax(peer, per_mb.to_numpy(float)), peer)
    scale = _ratio(peer, floored)
    units["peer_unit_time"] = floored
    for column in ("ratio", "ratio_p10", "ratio_p90", "cost_ratio"):
        if column in units:
            units[column] = np.where(is_link, units[column].to_numpy(float) * scale, units[column].to_numpy(float))


def _uneven_work(events: pd.DataFrame, steps: pd.DataFrame) -> set:
    """Cases whose ranks compute different amounts of work per step with no mask plan to say which blocks are
    partial (an imported causal or windowed ring: a trace shows shapes, not masks, so a diagonal block computed
    half, or a masked one skipped inside an empty range, looks like a fast one). Told by the steps' own times: per
    iteration, each rank's count of *full* steps (at least half its longest step) differs between ranks in most
    iterations. There a rank's unit time is its longest step (its full blocks), not a low quantile."""
    pairs = events.loc[events["kind"] == "compute", "pair"] if "pair" in events else pd.Series(dtype=object)
    if (pairs.notna() & (pairs.astype(str) != "")).any():  # a plan says which pairs are partial
        return set()
    computed = steps[steps["computes"] > 0]
    if computed.empty:
        return set()
    keys = ["case_id", "repeat", "iteration", "phase", "rank"]
    longest = computed.groupby(keys, observed=True)["ms"].transform("max")
    full = (computed["ms"] >= 0.5 * longest) & (longest > 0)
    counts = full.groupby([computed[k] for k in keys], observed=True).sum()
    spread = counts.groupby(level=keys[:-1], observed=True).agg(["min", "max"])
    differ = (spread["max"] > spread["min"]).groupby(level="case_id", observed=True).mean()
    return set(differ[differ > 0.5].index)


def _bounded_peers(links: pd.DataFrame, every: pd.DataFrame) -> pd.DataFrame:
    """Hops left without a baseline because too few of their peers were measured (their transfers censored:
    nobody waited, so each end is only a bound): judged against the peers' bounds instead. A bound is never
    shorter than the transfer, so the ratio is a lower bound of the true one, and an alarm it raises holds (a
    slow hop whose healthy peers' blocks were always in hand before anyone asked is still named)."""
    lacking = links["ratio"].isna() & (links["unit_time"] > 0)
    if not lacking.any():
        return links
    group, members = ["case_id", "phase", "exchange"], ["src", "dst"]
    bounded = _compare(every, group, members, LINK_MARGIN, min_peers=LINK_MIN_PEERS)
    bounded = bounded.dropna(subset=["ratio"]).set_index([*group, *members])
    where = pd.MultiIndex.from_frame(links.loc[lacking, [*group, *members]])
    peers = bounded["peer_unit_time"].reindex(where).to_numpy(float)
    links = links.copy()
    links.loc[lacking, "peer_unit_time"] = peers
    links.loc[lacking, "ratio"] = _ratio(links.loc[lacking, "unit_time"].to_numpy(float), peers)
    # Its interval: each iteration's bound against its peers' bounds, rescaled to the ratio measured here.
    scale = _ratio(links.loc[lacking, "ratio"].to_numpy(float), bounded["ratio"].reindex(where).to_numpy(float))
    for column in ("ratio_p10", "ratio_p90"):
        links.loc[lacking, column] = bounded[column].reindex(where).to_numpy(float) * scale
    return links


def _iteration_ratio(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (case, phase, rank): the median over iterations of its own time per iteration per unit of work against
    the other ranks' median (``cost_ratio``): the whole of a delay, whichever steps it lands on."""
    columns = ["case_id", "phase", "rank", "cost_ratio"]
    if steps.empty:
        return pd.DataFrame(columns=columns)
    per = steps.groupby(["case_id", "phase", "repeat", "iteration", "rank"], observed=True)[["ms", "flops"]].sum()
    has_work = per["flops"].groupby(level="case_id", observed=True).transform("max") > 0
    unit = per["ms"] / np.where(has_work, (per["flops"] / 1e9).where(per["flops"] > 0), 1.0)
    wide = unit.unstack("rank")  # rows (case, phase, repeat, iteration), columns ranks
    frames = []
    for (case_id, phase), block in wide.groupby(level=["case_id", "phase"], observed=True, sort=False):
        values = block.to_numpy(float)
        ratio = _ratio(values, _leave_one_out_median(values))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a rank absent from every iteration: NaN
            median = np.nanmedian(ratio, axis=0)
        frames.append(pd.DataFrame({"case_id": case_id, "phase": phase, "rank": block.columns.to_numpy(),
                                    "cost_ratio": median}))  # fmt: skip
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def clock_violations(xfers: pd.DataFrame, tol_ns: int = DEFAULT_TOL_NS) -> pd.Series:
    """Per case: the share of transfers whose block was in hand before its sender posted it (clocks disagree)."""
    if xfers.empty:
        return pd.Series(dtype=float)
    early = (xfers["send_start_ns"] - xfers["recv_end_ns"]) > tol_ns  # NaN sends compare False
    return early.groupby(xfers["case_id"], observed=True).mean()


def straggler_table(
    events: pd.DataFrame,
    xfers: pd.DataFrame | None = None,
    path: pd.DataFrame | None = None,
    *,
    rank_margin: float = RANK_MARGIN,
    link_margin: float = LINK_MARGIN,
    tol_ns: int = DEFAULT_TOL_NS,
    no_blame: frozenset[str] = frozenset(),
    segments: pd.DataFrame | None = None,
    link_floor_ms: float = 0.0,
) -> pd.DataFrame:
    """Per case, every rank and link: unit time against its peers, critical-path time and share, cost, flag.

    ``link_floor_ms``: the shortest transfer the record can resolve (an imported host-side trace: a late take);
    a link's peers' baseline is never shorter, so a ratio against healthy transfers below it does not measure
    noise (its interval is rescaled with it).

    ``no_blame``: cases whose timings cannot single out a rank or a link (the inconclusive cases of
    confidence.case_confidence): nothing is flagged there.

    A resource measured in several phases / exchanges is judged in each; the row shown is the one where it
    looked worst (flagged first, then highest ratio).
    """
    if xfers is None:
        xfers = transfers(events)
    if path is None or segments is None:
        path, segments = critical_path_segments(events, xfers, tol_ns)
    steps = rank_steps(events)
    units = _unit_times(events, xfers, steps)
    if link_floor_ms > 0 and len(units):
        _floor_links(units, link_floor_ms)
    if path.empty or units.empty:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    units[["rank", "src", "dst"]] = units[["rank", "src", "dst"]].fillna(-1).astype("int64")
    _mark_candidates(units, events, steps, rank_margin, link_margin)
    shown = units.sort_values(["candidate", "ratio"], ascending=False, na_position="last")
    shown = shown.drop_duplicates(_RESOURCE_KEYS).drop(columns=["phase", "exchange"])
    out = shown.merge(_path_costs(path, segments, shown).reset_index(), on=_RESOURCE_KEYS, how="left")
    out["flagged"] = _flagged(out, clock_violations(xfers, tol_ns), no_blame)
    out["tied"] = _ties(out)
    out = _replayed_costs(out, events, xfers, steps)
    # The interval brackets the ratio it goes with (a ratio of medians may lie outside its iterations' p10-p90).
    low, high, ratio = (out[c].to_numpy(float) for c in ("ratio_p10", "ratio_p90", "ratio"))
    out["ratio_p10"] = np.where(np.isnan(low), np.nan, np.fmin(low, ratio))
    out["ratio_p90"] = np.where(np.isnan(high), np.nan, np.fmax(high, ratio))
    return out[STRAGGLER_COLUMNS].sort_values(["case_id", "resource", "rank", "src", "dst"]).reset_index(drop=True)


def _mark_candidates(units: pd.DataFrame, events: pd.DataFrame, steps: pd.DataFrame, rank_margin: float,
                     link_margin: float) -> None:  # fmt: skip
    """Add to ``units`` (per group: phase / exchange) what each resource adds per iteration (``extra_ms``) and
    whether it passes every alarm threshold (``candidate``; module doc)."""
    computed = steps[steps["computes"] > 0]
    step_ms = computed.groupby(["case_id", "phase"], observed=True)["ms"].median()  # a step's own time
    iter_ms = step_times(events).groupby("case_id", observed=True)["step_ms"].median()
    is_link = units["resource"] == "link"
    excess = (units["unit_time"] - units["peer_unit_time"]) * units["mb"].fillna(1.0)  # a link's, per transfer
    busy = steps.groupby(["case_id", "phase", "rank", "repeat", "iteration"], observed=True)["ms"].sum()
    busy = busy.groupby(level=["case_id", "phase", "rank"], observed=True).median()
    rank_ms = busy.reindex(pd.MultiIndex.from_frame(units[["case_id", "phase", "rank"]])).to_numpy()
    slowdown = (1.0 - 1.0 / units["cost_ratio"].fillna(units["ratio"])).clip(lower=0.0)
    units["extra_ms"] = np.where(is_link, excess * units["per_iteration"], rank_ms * slowdown)
    step = step_ms.reindex(pd.MultiIndex.from_frame(units[["case_id", "phase"]])).to_numpy()
    iteration = iter_ms.reindex(units["case_id"]).to_numpy()
    margin = np.where(is_link, link_margin, rank_margin)
    strong = (units["ratio"] >= 1.0 + margin) & (units["consistency"] >= CONSISTENCY)
    strong &= units["extra_ms"] >= MIN_EXTRA_SHARE * iteration
    link_ok = excess >= LINK_MIN_EXCESS * np.nan_to_num(step, nan=0.0)
    units["candidate"] = (strong & (~is_link | link_ok)).fillna(False).astype(bool)
    _small_rings(units, events, steps, rank_margin, step_ms_ok=units["extra_ms"] >= MIN_EXTRA_SHARE * iteration)


def _small_rings(units: pd.DataFrame, events: pd.DataFrame, steps: pd.DataFrame, rank_margin: float,
                 step_ms_ok: pd.Series) -> None:  # fmt: skip
    """Ranks of rings too small for a majority (analysis/few_ranks.py): a rank slower than its peer by the alarm's
    margin, with the extra time, is a candidate when it was slower in most iterations *and* held its successor
    waiting in most of them (``structure``: the ring confirms what one or two peers cannot); otherwise it is
    ``undecided`` (the case is inconclusive)."""
    from ringbench.analysis.few_ranks import downstream_structure

    units["structure"] = np.nan
    units["undecided"] = False
    found = downstream_structure(events, steps, rank_margin)
    if found.empty:
        return
    is_rank = (units["resource"] == "rank").to_numpy()
    keyed = found.set_index(["case_id", "rank"])["structure"]
    index = pd.MultiIndex.from_frame(units[["case_id", "rank"]].astype({"rank": "int64"}))
    units["structure"] = np.where(is_rank, keyed.reindex(index).to_numpy(float), np.nan)
    small = is_rank & units["structure"].notna().to_numpy()
    alarm = small & (units["ratio"] >= 1.0 + rank_margin).to_numpy() & step_ms_ok.fillna(False).to_numpy(bool)
    held = units["structure"].to_numpy(float) >= CONSISTENCY
    steady = units["consistency"].to_numpy(float) >= CONSISTENCY
    units["candidate"] = np.where(small, alarm & steady & held, units["candidate"].to_numpy(bool))
    units["undecided"] = alarm & ~(steady & held)


def _path_costs(path: pd.DataFrame, segments: pd.DataFrame, shown: pd.DataFrame) -> pd.DataFrame:
    """Per resource of ``shown``: its median critical-path ms and share of the path, and its cost per iteration
    (median, p10, p90): critical-path time x (1 - 1/ratio), with the (whole-iteration) ratio of the row shown."""
    per_iter = path[path["resource"] != "other"].merge(shown[[*_RESOURCE_KEYS, "cost_ratio"]], on=_RESOURCE_KEYS,
                                                       how="left")  # fmt: skip
    excess = (1.0 - 1.0 / pd.to_numeric(per_iter["cost_ratio"], errors="coerce")).clip(lower=0.0).fillna(0.0)
    cost = per_iter["ms"] * excess
    # A link at its peers' speed shrinks each of its spans on the path only until the compute beside that exchange
    # is critical again: by at most the time its rank sat blocked on it (all of it with ``sync``, the wait's tail
    # with ``double``). So a link's cost is summed span by span.
    is_link_row = (per_iter["resource"] == "link").to_numpy()
    if is_link_row.any():
        hops = segments[segments["resource"] == "link"].merge(shown[[*_RESOURCE_KEYS, "cost_ratio"]],
                                                              on=_RESOURCE_KEYS, how="left")  # fmt: skip
        hop_excess = (1.0 - 1.0 / pd.to_numeric(hops["cost_ratio"], errors="coerce")).clip(lower=0.0).fillna(0.0)
        hops = hops.assign(cost=np.fmin(hops["ms"] * hop_excess, hops["exposed_ms"]))
        link_cost = hops.groupby([*GROUP_KEYS, "src", "dst"], observed=True)["cost"].sum()
        index = pd.MultiIndex.from_frame(per_iter[[*GROUP_KEYS, "src", "dst"]])
        cost = np.where(is_link_row, link_cost.reindex(index).fillna(0.0).to_numpy(), cost)
    per_iter = per_iter.assign(cost=np.asarray(cost, float), share=per_iter["ms"] / per_iter["path_ms"])
    grouped = per_iter.groupby(_RESOURCE_KEYS, observed=True)
    cp = grouped.agg(cp_ms=("ms", "median"), cp_share=("share", "median"), cost_ms=("cost", "median"))
    cost_q = grouped["cost"].quantile([0.1, 0.9]).unstack()
    cp["cost_ms_p10"], cp["cost_ms_p90"] = cost_q[0.1], cost_q[0.9]
    return cp


def _flagged(out: pd.DataFrame, violations: pd.Series, no_blame: frozenset[str]) -> np.ndarray:
    """Per row: a candidate in a case that can be blamed; a link only where the clocks agree (``violations``:
    clock_violations per case) and no flagged rank beside it explains it."""
    trusted = violations.reindex(out["case_id"]).fillna(0.0).to_numpy() <= CLOCK_VIOLATION_SHARE
    is_rank = out["resource"] == "rank"
    # A slow rank also makes the links into and out of it look slow (late posts, late completion stamps); a
    # slow link never makes compute spans longer. So a flagged rank takes precedence over the links it touches.
    # Unless the rank explains too little of the link: a link costing the ring several times what the flagged rank
    # beside it does (a helper thread's late send on a rank that the machine's noise also made a little slow) is
    # its own culprit, and both stay flagged (the costlier is named).
    ranks = out[is_rank & out["candidate"]]
    slow = dict(zip(zip(ranks["case_id"], ranks["rank"], strict=True), ranks["cost_ms"].fillna(np.inf), strict=True))
    cases, srcs, dsts, costs = out["case_id"], out["src"], out["dst"], out["cost_ms"].fillna(0.0)
    touches = np.array([
        max(slow.get((c, a), -1.0), slow.get((c, b), -1.0)) >= RANK_EXPLAINS_LINK * cost
        for c, a, b, cost in zip(cases, srcs, dsts, costs, strict=True)
    ], bool)  # fmt: skip
    blamable = ~out["case_id"].isin(no_blame).to_numpy()
    return (out["candidate"] & blamable & (is_rank | (trusted & ~touches))).astype(bool)


def _replayed_costs(table: pd.DataFrame, events: pd.DataFrame, xfers: pd.DataFrame, steps: pd.DataFrame
                    ) -> pd.DataFrame:  # fmt: skip
    """The cost of every flagged resource replayed (analysis/what_if.py): what its iterations would save with it
    at its peers' speed, alone (``cost_ms``) and, for resources tied with others, all of them together
    (``joint_cost_ms``). Unflagged rows keep the critical path's estimate (``cost_replayed`` False)."""
    from ringbench.analysis.what_if import replayed_cost

    table = table.assign(cost_replayed=False, joint_cost_ms=np.nan, joint_cost_ms_p10=np.nan, joint_cost_ms_p90=np.nan)
    for case_id, group in table[table["flagged"]].groupby("case_id", sort=False, observed=True):
        for index, row in group.iterrows():
            member = [(row["resource"], row["rank"], row["src"], row["dst"])]
            cost = replayed_cost(events, xfers, steps, case_id, member)
            if np.isfinite(cost[0]):
                table.loc[index, ["cost_ms", "cost_ms_p10", "cost_ms_p90"]] = cost
                table.at[index, "cost_replayed"] = True
        for resource in ("rank", "link"):
            company = group[group["tied"] & (group["resource"] == resource)]
            if len(company) < 2:
                continue
            members = list(zip(company["resource"], company["rank"], company["src"], company["dst"], strict=True))
            joint = replayed_cost(events, xfers, steps, case_id, members)
            table.loc[company.index, ["joint_cost_ms", "joint_cost_ms_p10", "joint_cost_ms_p90"]] = joint
    return table


def _ties(table: pd.DataFrame) -> np.ndarray:
    """Per row: flagged and equally to blame with its case's culprit (module doc, "Ties"), the culprit included
    when it has company."""
    tied = np.zeros(len(table), bool)
    for _, group in table.groupby("case_id", sort=False):
        flagged = group[group["flagged"]]
        if len(flagged) < 2:
            continue
        top = flagged.sort_values(["cost_ms", "ratio"], ascending=False).iloc[0]
        same = group[group["resource"] == top["resource"]]
        peers = same.loc[~same["flagged"], "unit_time"].dropna()
        spread = float(peers.max() - peers.min()) if len(peers) > 1 else 0.0
        resolution = max(TIE_SHARE * float(top["unit_time"]), spread)
        close = same["flagged"] & ((same["unit_time"] - float(top["unit_time"])).abs() <= resolution)
        if close.sum() >= 2:
            tied[table.index.get_indexer(same.index[close.to_numpy()])] = True
    return tied


def culprits(table: pd.DataFrame, violations: pd.Series | None = None) -> pd.DataFrame:
    """One row per case: the culprit (kind compute | link | None) with its ratio and cost, and the worst of each
    kind even when unflagged (how close the case came to an alarm). ``violations``: clock_violations(xfers)."""
    violations = violations if violations is not None else pd.Series(dtype=float)
    rows = []
    for case_id, group in table.groupby("case_id", sort=False):
        ranks, links = group[group["resource"] == "rank"], group[group["resource"] == "link"]
        worst_rank = ranks.loc[ranks["ratio"].idxmax()] if ranks["ratio"].notna().any() else None
        worst_link = links.loc[links["ratio"].idxmax()] if links["ratio"].notna().any() else None
        flagged = group[group["flagged"]].sort_values(["cost_ms", "ratio"], ascending=False)
        row = {c: None for c in CULPRIT_COLUMNS} | {"case_id": case_id}
        row["clock_violations"] = float(violations.get(case_id, 0.0))
        if len(flagged):
            top = flagged.iloc[0]
            row |= {key: top[key] for key in ("ratio", "cost_ms", "cost_ms_p10", "cost_ms_p90", "cp_share")}
            row |= {key: top.get(key) for key in ("ratio_p10", "ratio_p90")}
            company = (
                flagged[flagged["tied"] & (flagged["resource"] == top["resource"])] if top["tied"] else top.to_frame().T
            )
            if len(company) > 1:  # equally to blame: every one is named, and fixing one alone does not help
                joint = company["joint_cost_ms"].notna().all() if "joint_cost_ms" in company else False
                for key in ("cost_ms", "cost_ms_p10", "cost_ms_p90"):  # what fixing them all saves (replayed)
                    row[key] = float(company[f"joint_{key}"].iloc[0]) if joint else float(company[key].sum())
                row["cp_share"] = float(company["cp_share"].sum())
            if top["resource"] == "rank":
                row |= {"straggler_kind": "compute", "straggler_rank": int(top["rank"])}
                row["straggler_ranks"] = sorted(int(r) for r in company["rank"])
            else:
                row |= {"straggler_kind": "link", "slow_hop_src": int(top["src"]), "slow_hop_dst": int(top["dst"])}
                row["slow_hops"] = sorted([int(a), int(b)] for a, b in zip(company["src"], company["dst"], strict=True))
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


def censored_suspects(xfers: pd.DataFrame, events: pd.DataFrame) -> dict[str, str]:
    """Cases with a hop the trace cannot judge (case id -> the figures): most of its transfers censored (their
    end only a bound: nobody waited when they completed, confidence.py "censored"), and those bounds longer than a
    step's own work by the link alarm's margins: the ranks at both ends came to the block later than a step's
    work explains, yet no rank stood out. A bound of about a step is a transfer hidden behind the step (the
    usual case) and says nothing against the link. Whether the link was slow or its ranks took their blocks
    late, the trace does not say."""
    if xfers.empty or "censored" not in xfers or not xfers["censored"].any():
        return {}
    steps = rank_steps(events)
    computed = steps[steps["computes"] > 0]
    step_ms = computed.groupby("case_id", observed=True)["ms"].median()
    # A receiver busy with a full block takes its next one late by up to that block: per rank, its full steps'
    # median (steps of at least half its longest; a causal ring's empty and half blocks left out).
    longest = computed.groupby(["case_id", "rank"], observed=True)["ms"].transform("max")
    full_ms = computed[computed["ms"] >= 0.5 * longest].groupby(["case_id", "rank"], observed=True)["ms"].median()
    out = {}
    for case_id, case in xfers.groupby("case_id", observed=True, sort=False):
        measured_ms = case.loc[~case["censored"], "transfer_ms"]
        baseline = float(measured_ms.median()) if len(measured_ms) else 0.0
        hops = case.groupby(["src", "dst"], observed=True).agg(
            share=("censored", "mean"), bound=("transfer_ms", "median")
        )
        step = float(step_ms.get(case_id, 0.0))
        busy = np.array([float(full_ms.get((case_id, dst), 0.0)) for _, dst in hops.index])
        work = np.maximum(step, busy)
        floor = (1.0 + LINK_MARGIN) * np.maximum(baseline, work) + LINK_MIN_EXCESS * work
        doubtful = hops[(hops["share"] > 0.5) & (hops["bound"] > floor)].sort_values("bound", ascending=False)
        if len(doubtful):
            (src, dst), top = next(iter(doubtful.iterrows()))
            out[str(case_id)] = (
                f"hop {src} -> {dst}: {top['share']:.0%} of its transfers censored, bounded by {top['bound']:.3g} ms "
                f"against {baseline:.3g} ms measured on the others"
            )
    return out
