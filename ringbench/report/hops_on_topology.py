"""The placement section of a report: the run's ring hops against the topology (ringbench.analysis.hops_on_topology).

One summary line per case (its hop classes, the worst hop, the model's predicted ratio against the recommended ring
and the flagged hops), then a table of hops per case with flagged rows highlighted. Rendered like every other
section of the report content model, so HTML and Markdown carry the same words and every string is escaped there.
"""

from __future__ import annotations

from ringbench.analysis.hops_on_topology import CasePlacement, PlacedHop, Placement, StrategyTraffic, placement
from ringbench.errors import UsageError
from ringbench.fmt import number, ring_text
from ringbench.report.model import Section, Table

TITLE = "Placement: ring hops against the topology"
MAX_HOP_ROWS = 32
HEADERS = ("p", "hop", "class", "sharing", "model (us)", "transfer ms (median)", "p10–p90", "GB/s", "flag")


def _num(value: float, spec: str) -> str:
    return number(value, spec, missing="-")


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{label}×{count}" for label, count in sorted(counts.items())) or "-"


def _summary_lines(result: Placement) -> list[str]:
    lines = [
        f"Topology: {result.topology_text}"
        + (" — link costs EMULATED (injected delays), not a real network." if result.emulated_links else "."),
        f"Recommended ring: {result.recommended} (worst hop {result.recommended_worst_class}, "
        f"{result.recommended_worst_us:,.0f} us per message; hop classes {_counts(result.recommended_classes)}; "
        f"{result.method}). Launch: ringbench run --order {result.recommended}",
    ]
    for case in result.cases:
        flagged = case.flagged
        verdict = (
            "no slow hops" if not flagged else
            f"{len(flagged)} flagged hop{'s' * (len(flagged) != 1)}: "
            + ", ".join(f"{hop.src}→{hop.dst} {hop.link_class} ({'; '.join(hop.flags)})" for hop in flagged[:6])
            + (", ..." if len(flagged) > 6 else "")
        )  # fmt: skip
        ring = ring_text(case.ring)
        shared = max((hop.share for hop in case.hops), default=1)
        lines.append(
            f"{case.order or ring} (ring {ring}): step {_num(case.step_ms, '.2f')} ms; hop classes "
            f"{_counts(case.class_counts)}; worst hop {case.worst_hop_class}"
            + (f" ({shared} NET hops share one host pair's link)" if shared > 1 else "")
            + f"; the model predicts ×{case.predicted_speedup:.2f} the recommended ring's communication per step; "
            f"{verdict}."
        )
    lines.extend(result.notes)
    return lines


def _hop_cells(hop: PlacedHop) -> list[str]:
    return [
        str(hop.position),
        f"{hop.src}→{hop.dst}",
        hop.link_class,
        f"{hop.share} hops" if hop.share > 1 else "",
        f"{hop.model_us:,.0f}",
        _num(hop.transfer_ms, ".3f"),
        f"{_num(hop.transfer_ms_p10, '.3f')}–{_num(hop.transfer_ms_p90, '.3f')}",
        _num(hop.bandwidth_gbps, ".3g"),
        "; ".join(hop.flags),
    ]


def _hop_table(case: CasePlacement) -> Table:
    hops, note = list(case.hops), ""
    if len(hops) > MAX_HOP_ROWS:
        hops = case.flagged[:MAX_HOP_ROWS]
        note = f"{len(case.hops)} hops: only flagged ones are listed ({len(case.flagged)})"
    ring = ring_text(case.ring)
    return Table(
        title=f"{case.order or ring}: ring {ring}, {case.phase} transfers ({case.case_id})",
        columns=list(HEADERS),
        rows=[_hop_cells(hop) for hop in hops],
        note=note,
        highlight=tuple(index for index, hop in enumerate(hops) if hop.flags),
    )


def placement_section(run, hops=None) -> Section | None:
    """The section for ``run``; None when it records no topology, a note when its topology cannot be read."""
    try:
        result = placement(run, hops)
    except UsageError as exc:
        return Section(title=TITLE, notes=(f"The run's topology could not be read: {exc}",))
    if result is None:
        return None
    model = (
        f"Model: {result.model}. The predicted ratio per case also divides a network link's bandwidth among the "
        "NET hops between the same two hosts."
    )
    return Section(
        title=TITLE,
        lines=tuple(_summary_lines(result)) + tuple(_traffic_line(t) for t in result.traffic),
        tables=tuple(_hop_table(case) for case in result.cases) + tuple(_traffic_table(t) for t in result.traffic),
        notes=(model,),
    )


TRAFFIC_HEADERS = ("exchange", "class", "pairs", "MB / iteration", "transfer ms (median)")


def _traffic_line(traffic: StrategyTraffic) -> str:
    """Which physical links a strategy's traffic crosses, in one sentence."""
    where = f" @{traffic.placement}" if traffic.placement else ""
    parts = [f"{row.exchange} over {row.link_class} ×{row.pairs}" for row in traffic.rows]
    return f"{traffic.strategy}{where}: step {_num(traffic.step_ms, '.2f')} ms; traffic " + ", ".join(parts) + "."


def _traffic_table(traffic: StrategyTraffic) -> Table:
    where = f" @{traffic.placement}" if traffic.placement else ""
    rows = [
        [row.exchange, row.link_class, str(row.pairs), _num(row.mb_per_iteration, ".3g"), _num(row.transfer_ms, ".3f")]
        for row in traffic.rows
    ]
    return Table(
        title=f"{traffic.strategy}{where}: traffic by link class ({traffic.case_id})",
        columns=list(TRAFFIC_HEADERS),
        rows=rows,
    )
