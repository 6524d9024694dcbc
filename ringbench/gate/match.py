"""Pairing the cases of two sides, and refusing comparisons whose must-match metadata differ.

Must-match metadata is what makes two timings comparable at all: the device kind, the communication backend, the
torch version and whether compute was emulated (run level, from meta.json), and the world size and dtype (case
level). A difference there explains any change in timing by itself, so the gate refuses to compare, with one line
naming every difference, unless the caller allows it.

World and dtype are case axes, so matched cases always agree on them; at run level they differ when the two
sides share no world size (or no dtype) at all, which is what a wrong ``--world``/``--dtype`` on one side looks
like. A scenario that merely gained or lost a case still compares; the extra cases are listed as one-sided. Two emulated
cases that ran at different rates (``emulated:auto`` chose differently on two machines) are a mismatch too.
With mismatches allowed, a field that has one value per side (e.g. bf16 vs fp16) is dropped from the matching key
so that the otherwise-equal cases pair up.

Injected faults (``run --fault``) are not must-match. They are a run-level setting (every case of a run has the
same ``faults``), a deliberate perturbation of the code under test rather than a property of the machine, and a
fault-injected run is the honest way to check that the gate catches a slowdown (``--fault slow-rank:R:2`` on every
rank doubles the compute). So when each side ran under one set of faults, cases pair across differing sets and the
difference is reported (``Matching.differences``, printed as a note), never silently. Only when a side mixes fault
sets (a synthetic run, or a run resumed with other faults) does ``faults`` stay in the key, so that a faulted case
pairs with the equally faulted one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringbench.errors import UsageError
from ringbench.gate.samples import MATCH_FIELDS, CaseSamples, SampleSet

MUST_MATCH_META = ("device_kind", "backend", "torch_version", "emulated")
MUST_MATCH_CASE_FIELDS = ("world", "dtype")


@dataclass(frozen=True, kw_only=True)
class Matching:
    """The outcome of pairing two sides."""

    pairs: tuple[tuple[CaseSamples, CaseSamples], ...]
    """(baseline, current) for every case present on both sides, in the current side's order."""
    only_baseline: tuple[CaseSamples, ...]
    only_current: tuple[CaseSamples, ...]
    mismatches: tuple[str, ...]
    """Must-match differences (non-empty only when allowed)."""
    key_fields: tuple[str, ...]
    """The fields cases were matched on (MATCH_FIELDS less any dropped field)."""
    differences: tuple[str, ...] = ()
    """Differences that do not stop a comparison but must be shown: the injected faults of each side."""


def _meta_value(side: SampleSet, name: str) -> object:
    if name == "emulated":
        return side.emulated
    return side.meta.get(name)


def metadata_mismatches(baseline: SampleSet, current: SampleSet) -> list[str]:
    """One phrase per must-match difference, e.g. ``backend: 'gloo' (baseline) vs 'nccl' (current)``."""
    found = []
    for name in MUST_MATCH_META:
        before, after = _meta_value(baseline, name), _meta_value(current, name)
        if before != after:
            found.append(f"{name}: {before!r} (baseline) vs {after!r} (current)")
    for name in MUST_MATCH_CASE_FIELDS:
        before = {case.axes.get(name) for case in baseline.cases}
        after = {case.axes.get(name) for case in current.cases}
        if before and after and not before & after:
            found.append(f"{name}: {_values(before)} (baseline) vs {_values(after)} (current)")
    return found


def _values(values: set) -> str:
    return ", ".join(sorted(repr(value) for value in values))


def _key(case: CaseSamples, fields: tuple[str, ...]) -> tuple:
    return tuple(case.axes.get(name) for name in fields)


def _droppable(baseline: SampleSet, current: SampleSet) -> tuple[str, ...]:
    """Mismatching case fields with exactly one value on each side: matching can ignore them."""
    dropped = []
    for name in MUST_MATCH_CASE_FIELDS:
        before = {case.axes.get(name) for case in baseline.cases}
        after = {case.axes.get(name) for case in current.cases}
        if len(before) == 1 and len(after) == 1 and before != after:
            dropped.append(name)
    return tuple(dropped)


def fault_sets(side: SampleSet) -> set[str]:
    """The distinct ``faults`` values of a side's cases ("" for none)."""
    return {str(case.axes.get("faults") or "") for case in side.cases}


def _describe_faults(faults: set[str]) -> str:
    return ", ".join(repr(value) if value else "none" for value in sorted(faults))


def fault_differences(baseline: SampleSet, current: SampleSet) -> list[str]:
    """One phrase when either side ran with injected faults, e.g. ``faults: none (baseline) vs 'slow-rank:0:2' ...``."""
    before, after = fault_sets(baseline), fault_sets(current)
    if not (before | after) - {""}:
        return []
    relation = "differ" if before != after else "are the same on both sides"
    return [
        f"injected faults {relation}: {_describe_faults(before)} (baseline) vs {_describe_faults(after)} (current); "
        "the timings include them"
    ]


def match_cases(baseline: SampleSet, current: SampleSet, *, allow_mismatch: bool = False) -> Matching:
    """Pair cases by their axes (plus faults when a side mixes fault sets); raise UsageError on must-match
    differences unless allowed."""
    mismatches = metadata_mismatches(baseline, current)
    dropped: tuple[str, ...] = ()
    if allow_mismatch:
        dropped = _droppable(baseline, current)
    if len(fault_sets(baseline)) <= 1 and len(fault_sets(current)) <= 1:
        dropped = (*dropped, "faults")  # one run-level setting per side: pair across it, report it
    fields = tuple(name for name in MATCH_FIELDS if name not in dropped)

    by_key = {_key(case, fields): case for case in baseline.cases}
    pairs, only_current = [], []
    for case in current.cases:
        partner = by_key.pop(_key(case, fields), None)
        if partner is None:
            only_current.append(case)
            continue
        if partner.emulated != case.emulated:
            mismatches.append(
                f"emulated: {partner.emulated!r} (baseline) vs {case.emulated!r} (current) for case {case.case_ids[0]}"
            )
        rates = (partner.emulated_gflops, case.emulated_gflops)
        if None not in rates and rates[0] != rates[1]:  # e.g. emulated:auto chose differently on each side
            mismatches.append(
                f"emulated rate: {rates[0]:g} GFLOP/s (baseline) vs {rates[1]:g} (current) for case "
                f"{case.case_ids[0]}; pin the rate (emulated:GFLOPS) to gate on it"
            )
        pairs.append((partner, case))

    if mismatches and not allow_mismatch:
        raise UsageError(
            f"{baseline.source} and {current.source} are not comparable: {'; '.join(mismatches)} "
            "(pass --allow-mismatch to compare anyway)"
        )
    if not pairs:
        raise UsageError(
            f"{baseline.source} and {current.source} have no case in common "
            f"({len(baseline.cases)} vs {len(current.cases)} cases with samples)"
        )
    return Matching(
        pairs=tuple(pairs),
        only_baseline=tuple(by_key.values()),
        only_current=tuple(only_current),
        mismatches=tuple(mismatches),
        key_fields=fields,
        differences=tuple(fault_differences(baseline, current)),
    )
