"""Every tie named: when several ranks or hops are equally to blame, the verdict names all of them, gives the cost
of fixing them together (replayed: analysis/what_if.py) and says that fixing one alone does not help (runs,
imports and simulated records share the analysis)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from test_critical_path import COMPUTE_MS, LINK_MS, _ring

from ringbench.analysis.answers import answers
from ringbench.analysis.findings import analyze, verdict_document, verdict_lines
from ringbench.analysis.stragglers import culprits, straggler_table
from ringbench.record.store import RunData


def _analysis(events: pd.DataFrame):
    return analyze(RunData(path=Path("hand"), events=events, cases=pd.DataFrame(), meta={"schema_version": 3}))


def test_two_equally_slow_ranks_are_both_named_with_the_cost_of_fixing_both():
    events = _ring("double", compute=[COMPUTE_MS, 1.5 * COMPUTE_MS, COMPUTE_MS, 1.5 * COMPUTE_MS])
    table = straggler_table(events)
    row = culprits(table).iloc[0]
    assert row["straggler_kind"] == "compute" and row["straggler_ranks"] == [1, 3], row
    tied = table[table["tied"]]
    assert sorted(tied["rank"]) == [1, 3] and row["cost_ms"] == tied["joint_cost_ms"].iloc[0]
    # Fixing one alone leaves the other on the path: it saves much less than fixing both.
    assert tied["cost_ms"].max() < 0.5 * row["cost_ms"], (tied["cost_ms"].tolist(), row["cost_ms"])
    analysis = _analysis(events)
    document = verdict_document(analysis)
    assert document["straggler_ranks"] == [1, 3] and document["straggler_kind"] == "compute"
    line = next(line for line in verdict_lines(analysis) if line.startswith("Straggler"))
    assert line.startswith("Stragglers: ranks 1 and 3 (compute)") and "fixing one alone does not help" in line, line
    block = answers(analysis)
    assert block.straggler.startswith("ranks 1 and 3 (compute)") and "fixing one alone" in block.straggler
    assert block.headline.startswith("ranks 1 and 3 (compute) hold the ring back"), block.headline


def test_two_equally_slow_hops_are_both_named():
    events = _ring("sync", links={(0, 1): LINK_MS + 2.0, (2, 3): LINK_MS + 2.0})
    row = culprits(straggler_table(events)).iloc[0]
    assert row["straggler_kind"] == "link" and row["slow_hops"] == [[0, 1], [2, 3]], row
    line = next(line for line in verdict_lines(_analysis(events)) if line.startswith("Slow hop"))
    assert line.startswith("Slow hops: 0 -> 1 and 2 -> 3 (links)") and "fixing one alone" in line, line


def test_a_clearly_slower_rank_is_named_alone():
    events = _ring("double", compute=[COMPUTE_MS, 1.5 * COMPUTE_MS, COMPUTE_MS, 2.5 * COMPUTE_MS])
    row = culprits(straggler_table(events)).iloc[0]
    assert (row["straggler_kind"], row["straggler_rank"], row["straggler_ranks"]) == ("compute", 3, [3]), row


def test_a_slow_hop_whose_healthy_peers_were_mostly_censored_is_still_named():
    """An imported trace where nobody waited on two healthy hops' blocks (censored: each end only a bound) leaves
    the slow hop one measured peer; judged against its peers' bounds too (never shorter than the transfers), it
    is named, and a clean ring with the same censoring names nothing."""
    verdicts = []
    for links in ({(1, 2): LINK_MS + 4.0}, None):
        events = _ring("sync", links=links)
        hop = list(zip(events["src"], events["dst"], strict=True))
        events["censored"] = [kind == "recv" and pair in ((0, 1), (3, 0)) for kind, pair in zip(events["kind"], hop,
                                                                                                 strict=True)]  # fmt: skip
        assert events["censored"].sum() > 0
        table = culprits(straggler_table(events))
        verdicts.append(None if table.empty else (table.iloc[0]["straggler_kind"], table.iloc[0]["slow_hops"]))
    assert verdicts[0] == ("link", [[1, 2]]), verdicts
    assert verdicts[1] is None or verdicts[1][0] is None, verdicts
