"""Which strategy won, per context: the answers block's line for a run that varied the strategy.

A strategy comes with the settings that apply to it (its buffer, its placement, its ring order; ringbench's cases
normalise the rest away), so strategies are compared in *contexts* that agree on every other axis (world, S, heads,
mask, layout, dtype, kernel, ...): in each, a strategy's time is that of its fastest case (median step time over
timed iterations), and the winner is the fastest strategy. One line per context:

    strategy (S=4096, zigzag): hybrid:2 (double, heads-first) fastest, 140.7 ms; ulysses 1.02x, ring 1.10x slower

Only cases whose step times can be compared count (answers._comparable). Pure function of the record's tables.
"""

from __future__ import annotations

import pandas as pd

from ringbench.fmt import number
from ringbench.record.schema import CASE_AXES

SETTINGS = ("strategy", "buffer", "placement", "order")  # what comes with a strategy
UNITS = {"world": "{} ranks", "seq": "S={}", "heads": "{} heads", "head_dim": "D={}", "batch": "B={}"}
WINNER_COLUMNS = ["context", "strategy", "case_id", "step_ms", "runner_up", "margin", "line"]


def strategy_of(cases: pd.DataFrame) -> pd.Series:
    """The strategy of each case row; records made before strategies: ring, or allgather for that buffer."""
    recorded = cases["strategy"] if "strategy" in cases else pd.Series(index=cases.index, dtype=object)
    fallback = cases["buffer"].astype(str).map(lambda b: "allgather" if b == "allgather" else "ring")
    return recorded.where(recorded.notna() & (recorded.astype(str) != ""), fallback).astype(str)


def _label(row: pd.Series) -> str:
    """A strategy's case, with the settings that say which of its variants it was."""
    extras = [str(row[name]) for name in ("buffer", "placement") if str(row.get(name) or "") not in ("", "nan")]
    if str(row["strategy"]) in ("allgather", "ulysses"):
        extras = [e for e in extras if e not in ("allgather", "sync")]
    return str(row["strategy"]) + (f" ({', '.join(extras)})" if extras else "")


def strategy_winners(cases: pd.DataFrame, step_ms: pd.Series, comparable: set[str] | None = None) -> pd.DataFrame:
    """Per context where at least two strategies ran: the winner, its step time, the runner-up and its margin
    (runner-up time / winner time), and the answers line. ``step_ms``: median step time per case id."""
    if cases.empty:
        return pd.DataFrame(columns=WINNER_COLUMNS)
    table = cases.drop_duplicates("case_id").copy()
    table["strategy"] = strategy_of(table)
    table["step"] = table["case_id"].map(step_ms)
    if comparable is not None:
        table = table[table["case_id"].astype(str).isin(comparable)]
    table = table[table["step"].notna()]
    if table["strategy"].nunique() < 2:
        return pd.DataFrame(columns=WINNER_COLUMNS)
    others = [a for a in CASE_AXES if a in table and a not in SETTINGS]
    varied = [a for a in others if table[a].astype(str).nunique() > 1]
    rows = []
    for _, group in table.groupby([table[a].astype(str) for a in others], sort=False, dropna=False):
        best = group.sort_values("step").drop_duplicates("strategy")  # each strategy's fastest variant
        if len(best) < 2:
            continue
        first = best.iloc[0]
        context = ", ".join(UNITS.get(a, "{}").format(first[a]) for a in varied)
        slower = [f"{_label(r)} {number(r['step'] / first['step'], '.2f')}×" for _, r in best.iloc[1:].iterrows()]
        where = f" ({context})" if context else ""
        line = (f"strategy{where}: {_label(first)} fastest, {number(first['step'], '.1f')} ms; "
                f"{', '.join(slower)} slower")  # fmt: skip
        rows.append({"context": context, "strategy": str(first["strategy"]), "case_id": str(first["case_id"]),
                     "step_ms": float(first["step"]), "runner_up": str(best.iloc[1]["strategy"]),
                     "margin": float(best.iloc[1]["step"] / first["step"]), "line": line})  # fmt: skip
    return pd.DataFrame(rows, columns=WINNER_COLUMNS)


__all__ = ["SETTINGS", "WINNER_COLUMNS", "strategy_of", "strategy_winners"]
