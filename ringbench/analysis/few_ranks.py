"""Rings too small for a majority: a slow rank judged against the ring's own structure.

A rank is named a straggler when it is slower than the median of the *other* ranks in most iterations
(analysis/stragglers.py). With two ranks the only other rank is the whole baseline, and with three, one of two
peers; noise on either side (real compute sharing cores, a machine busy with other work) moves the ratio and its
consistency, and two slow ranks out of three outvote the healthy one. The ring itself says more: a rank that holds
the ring back makes the rank after it wait. So in rings of fewer than ``FEW_RANKS`` ranks a rank's case is also
judged per iteration on

  structure   the share of iterations in which the rank's own time (compute and own work) exceeds its
              successor's by at least the alarm's margin, and the successor sat blocked (waiting on an exchange,
              at a barrier) for at least half that excess: the wait the slow rank causes downstream.

stragglers.py then names a rank of a small ring when it is slower than its peer in most iterations *and* the
ring's structure confirms it (it held its successor waiting in most of them): one or two peers are too few to
outvote noise alone. When its ratio and extra time pass the alarm but the two do not both hold, the case is
*inconclusive* (confidence reason ``few_ranks``, ``undecided``): neither "no straggler" nor a name would be
honest.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

FEW_RANKS = 4  # rings of fewer ranks are judged on their structure too
BLOCKED = ("wait", "sync", "collective")
STRUCTURE_COLUMNS = ["case_id", "rank", "structure", "iterations"]


def successors(events: pd.DataFrame) -> pd.DataFrame:
    """Per (case, rank): the rank after it in the ring (``successor``), from the events' ring positions."""
    pos = events.loc[events["ring_position"] >= 0, ["case_id", "rank", "ring_position"]].drop_duplicates()
    world = pos.groupby("case_id", observed=True)["rank"].transform("nunique")
    nxt = pos.assign(ring_position=(pos["ring_position"] - 1) % world).rename(columns={"rank": "successor"})
    return pos.merge(nxt, on=["case_id", "ring_position"], how="left")[["case_id", "rank", "successor"]]


def downstream_structure(events: pd.DataFrame, steps: pd.DataFrame, margin: float) -> pd.DataFrame:
    """Per (case, rank) of rings of fewer than FEW_RANKS ranks: ``structure`` (module doc) over ``iterations``.
    ``steps``: stragglers.rank_steps(events)."""
    world = events.groupby("case_id", observed=True)["rank"].nunique()
    small = world[(world >= 2) & (world < FEW_RANKS)].index
    if steps.empty or not len(small):
        return pd.DataFrame(columns=STRUCTURE_COLUMNS)
    mine = events[events["case_id"].isin(small)]
    own = steps[steps["case_id"].isin(small)].groupby(["case_id", "repeat", "iteration", "rank"], observed=True)[
        "ms"].sum()  # fmt: skip
    blocked = mine[mine["kind"].isin(BLOCKED)]
    waited = ((blocked["end_ns"] - blocked["start_ns"]) / 1e6).groupby(
        [blocked["case_id"], blocked["repeat"], blocked["iteration"], blocked["rank"]], observed=True).sum()  # fmt: skip
    table = own.rename("own").to_frame().join(waited.rename("blocked"), how="left").fillna({"blocked": 0.0})
    table = table.reset_index().merge(successors(mine), on=["case_id", "rank"], how="left")
    after = table[["case_id", "repeat", "iteration", "rank", "own", "blocked"]].rename(
        columns={"rank": "successor", "own": "next_own", "blocked": "next_blocked"})  # fmt: skip
    table = table.merge(after, on=["case_id", "repeat", "iteration", "successor"], how="left")
    excess = table["own"] - table["next_own"]
    held = (excess >= margin * table["next_own"]) & (table["next_blocked"] >= 0.5 * excess)
    table = table.assign(held=held.to_numpy(bool))
    out = table.groupby(["case_id", "rank"], observed=True).agg(structure=("held", "mean"),
                                                                 iterations=("held", "size"))  # fmt: skip
    return out.reset_index()[STRUCTURE_COLUMNS]


def undecided_sentence(row: pd.Series, world: int) -> str:
    """Why a small ring's case names nobody (a straggler table row of the rank that came closest)."""
    ratio = row["ratio"]
    return (
        f"rank {int(row['rank'])}'s own time is {ratio:.2f}x its peer's"
        f"{' (median of the other two)' if world == 3 else ''}; it was slower in "
        f"{_pct(row.get('consistency'))} of the iterations and held its successor waiting in "
        f"{_pct(row.get('structure'))} of them (both must hold in most)"
    )


def _pct(value) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.0%}"


__all__ = ["FEW_RANKS", "STRUCTURE_COLUMNS", "downstream_structure", "successors", "undecided_sentence"]
