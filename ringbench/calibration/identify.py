"""What a calibration run can identify, and the stated priors for what it cannot.

A compute span is one pair of the mask plan: ``calls`` kernel calls and ``g[kind]`` computed GFLOP per mask kind,
so per phase the medians per (case, pair class) satisfy

    ms = calls x call_ms + sum over kinds of g[kind] x nominal_ms_per_GFLOP x efficiency[kind]

One block size per kind gives rows that are multiples of each other in (calls, g): a per-call cost and a rate
cannot be told apart (issue: a single-case calibration put all the compute into the call constant, so half-size
blocks cost as much as full ones). An unknown is *determined* when its unit vector lies in the row space of the
(column-scaled) design matrix, up to a relative singular-value tolerance; the rest get priors, in this order:

  efficiency[kind]   emulated kernels: 1.0, the emulated kernel's nominal rate (it pads every block to exactly
                     FLOPs / rate); real kernels: the same time per computed FLOP as the other kinds (one rate)
  call_ms            the other phase's figure when that phase determined it; else 0 (all time in the rate)
  a phase not run    the other phase's figures (the FLOP formula already prices the backward at 2.5x)
  a kind not run     emulated: the nominal rate; real: the measured kinds' mean efficiency

Each cost carries a `CostSource`: determined or assumed, how, and what run would determine it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ringbench.simulate.costs import KINDS, PHASES, CostSource

SINGULAR_TOLERANCE = 0.05
"""Singular values below this share of the largest (columns scaled to 1) count as not determined: two block sizes
within a few percent of each other identify a call cost only in exact arithmetic, not in measured medians."""


def determined(a: np.ndarray) -> np.ndarray:
    """(columns,) bool: which unknowns of ``a @ x = b`` the rows determine (numerically, SINGULAR_TOLERANCE)."""
    if a.size == 0:
        return np.zeros(a.shape[1], bool)
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    _, s, vt = np.linalg.svd(a / scale, full_matrices=False)
    basis = vt[s > SINGULAR_TOLERANCE * s[0]] if s.size and s[0] > 0 else vt[:0]
    out = np.zeros(a.shape[1], bool)
    for j in range(a.shape[1]):
        unit = np.zeros(a.shape[1])
        unit[j] = 1.0
        out[j] = np.linalg.norm(unit - basis.T @ (basis @ unit)) < 1e-6
    return out


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    if a.shape[1] == 0:
        return np.zeros(0)
    scale = np.where(np.abs(a).max(axis=0) > 0, np.abs(a).max(axis=0), 1.0)
    x, _ = nnls(a / scale, b)
    return x / scale


@dataclass(kw_only=True)
class PhaseFit:
    """One phase's compute costs and where each came from."""

    call_ms: float
    efficiency: dict[str, float]
    sources: list[CostSource]
    spans: int = 0
    groups: int = 0
    median_rel_residual: float = float("nan")
    sizes: dict[str, list[float]] | None = None
    """Per kind: the distinct computed GFLOP per call the run measured (how many block sizes it saw)."""


def _sizes(med: pd.DataFrame, kinds: list[str]) -> dict[str, list[float]]:
    out = {}
    for kind in kinds:
        per_call = (med[f"g_{kind}"] / med["calls"]).where(med[f"g_{kind}"] > 0).dropna()
        out[kind] = sorted({round(float(v), 12) for v in per_call})
    return out


def fit_phase(part: pd.DataFrame, phase: str, *, emulated: bool, seq_hint: str) -> PhaseFit:
    """The compute costs of one phase from its spans (rows of calibrate's compute table), with their sources.

    ``emulated``: every row's nominal rate is an emulated kernel's (the prior efficiency 1.0 holds);
    ``seq_hint``: the run to suggest when a cost is not determined (e.g. "add --seq 2048 to the calibration run").
    """
    med = part.groupby(["case_id", "cls"], observed=True).agg(
        ms=("ms", "median"), calls=("calls", "first"), nominal=("nominal", "first"),
        **{f"g_{k}": (f"gflop_{k}", "first") for k in KINDS},
    )  # fmt: skip
    med = med[med["calls"] > 0]
    kinds = [k for k in KINDS if (med[f"g_{k}"] > 0).any()]
    sizes = _sizes(med, kinds)
    calls = med["calls"].to_numpy(float)
    work = {k: (med[f"g_{k}"] * med["nominal"]).to_numpy(float) for k in kinds}  # ms at efficiency 1
    b = med["ms"].to_numpy(float)
    hint = f"{seq_hint}: one block size per mask kind cannot separate a kernel call's cost from its rate"
    sources: list[CostSource] = []

    def efficiency_source(kind: str, ok: bool, how: str) -> None:
        sources.append(CostSource(cost=f"compute.{phase}.efficiency.{kind}", determined=ok, how=how,
                                  hint="" if ok else hint))  # fmt: skip

    # Unknown columns: the call cost, then one rate per group of kinds (one kind each until a prior merges them).
    groups: list[list[str]] = [[k] for k in kinds]
    fixed: dict[str, float] = {}
    known = determined(np.column_stack([calls, *(work[k] for k in kinds)]))
    if not known.all():
        if emulated:  # the emulated kernel pads every block to FLOPs / its rate: efficiency 1 is the model's truth
            for kind, ok in zip(kinds, known[1:], strict=True):
                if not ok:
                    fixed[kind] = 1.0
                    efficiency_source(kind, False, "1.0: the emulated kernel's nominal rate")
            groups = [g for g in groups if g[0] not in fixed]
        elif len(kinds) > 1 and not determined(np.column_stack([work[k] for k in kinds])).all():
            groups = [list(kinds)]  # real kernels: one time per computed FLOP for every kind, when even without a
            # call cost the kinds cannot be told apart (else: each kind its own rate, the call cost the prior)
    columns = [calls] + [sum(work[k] for k in group) for group in groups]
    known = determined(np.column_stack(columns))
    rhs = b - sum((work[k] * v for k, v in fixed.items()), np.zeros_like(b))
    if known[0]:
        x = _nnls(np.column_stack(columns), rhs)
        call, rates = float(x[0]), x[1:]
        count = max((len(v) for v in sizes.values()), default=0)
        sources.append(CostSource(cost=f"compute.{phase}.call_ms", determined=True,
                                  how=f"fitted on {len(med)} (case, pair class) medians, {count} block size(s)"))  # fmt: skip
    else:
        call, rates = 0.0, _nnls(np.column_stack(columns[1:]), rhs) if len(columns) > 1 else np.zeros(0)
        sources.append(CostSource(cost=f"compute.{phase}.call_ms", determined=False,
                                  how="0: no per-call cost (a call's whole time taken as its rate)",
                                  hint=hint))  # fmt: skip
    efficiency = dict(fixed)
    for group, rate, ok in zip(groups, rates, known[1:], strict=True):
        for kind in group:
            efficiency[kind] = float(rate)
            if len(group) > 1:
                efficiency_source(kind, False, "one time per computed FLOP for every mask kind (the run cannot tell "
                                  "the kinds' rates apart)")  # fmt: skip
            else:
                efficiency_source(kind, bool(ok), f"fitted ({len(sizes[kind])} block size(s))" if ok else
                                  "fitted with the call cost assumed")  # fmt: skip
    predicted = calls * call + sum((work[k] * efficiency.get(k, 0.0) for k in kinds), np.zeros_like(b))
    residual = float(np.median(np.abs(predicted - b) / np.clip(b, 1e-9, None))) if len(b) else float("nan")
    for kind in [k for k, v in efficiency.items() if v <= 0]:  # the call cost explained the spans: no rate left
        sources[:] = [src for src in sources if src.cost != f"compute.{phase}.efficiency.{kind}"]
        efficiency_source(kind, False, "the other kinds' rate: the fit left no time to these blocks' FLOPs (the "
                          "call cost explains their spans)")  # fmt: skip
    efficiency = {k: v for k, v in efficiency.items() if v > 0}
    return PhaseFit(call_ms=call, efficiency=efficiency, sources=sources, spans=len(part), groups=len(med),
                    median_rel_residual=residual, sizes=sizes)  # fmt: skip


def _from_other(source: PhaseFit, phase: str, other: str, *, emulated: bool) -> PhaseFit:
    """A phase the run did not measure: the other phase's figures, every one a prior."""
    run = "forward and backward (without --no-backward)" if phase == "bwd" else "the forward"
    hint = f"calibrate on a run of {run}"
    rate = (
        "the emulated kernel's nominal rate (it prices the backward at 2.5x the forward's FLOPs)"
        if emulated
        else f"the {_name(other)}'s time per FLOP (the backward at 2.5x the forward's FLOPs, the kernels' ratio)"
    )
    fit = PhaseFit(call_ms=source.call_ms, sources=[],
                   efficiency=dict.fromkeys(source.efficiency, 1.0) if emulated else dict(source.efficiency))  # fmt: skip
    fit.sources.append(CostSource(cost=f"compute.{phase}.call_ms", determined=False,
                                  how=f"the {_name(other)}'s call cost ({_name(phase)} not measured)", hint=hint))  # fmt: skip
    for kind in source.efficiency:
        fit.sources.append(CostSource(cost=f"compute.{phase}.efficiency.{kind}", determined=False, how=rate,
                                      hint=hint))  # fmt: skip
    return fit


def complete(fits: dict[str, PhaseFit], *, emulated: bool) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """(efficiency per phase and kind, call_ms per phase) for every phase and kind, priors where nothing was
    measured; ``fits`` gains the phases the run did not measure, and every prior's source."""
    for phase in PHASES:
        other = next(p for p in PHASES if p != phase)
        if phase not in fits and other in fits:
            fits[phase] = _from_other(fits[other], phase, other, emulated=emulated)
    efficiency: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        fit = fits[phase]
        measured = {k: v for k, v in fit.efficiency.items() if v > 0}
        fill = 1.0 if emulated or not measured else float(np.mean(list(measured.values())))
        for kind in KINDS:
            if kind not in measured and _source(fit, f"compute.{phase}.efficiency.{kind}") is None:
                how = "the emulated kernel's nominal rate" if emulated else "the measured mask kinds' mean rate"
                fit.sources.append(CostSource(cost=f"compute.{phase}.efficiency.{kind}", determined=False,
                                              how=f"{how} (no {kind} blocks measured)",
                                              hint=f"calibrate on a run whose mask plan has {kind} blocks"))  # fmt: skip
        efficiency[phase] = {k: measured.get(k, fill) for k in KINDS}
    # A call cost one phase determined stands in for the other phase's "0" prior.
    for phase in PHASES:
        other = next(p for p in PHASES if p != phase)
        mine = _source(fits[phase], f"compute.{phase}.call_ms")
        theirs = _source(fits[other], f"compute.{other}.call_ms")
        if mine is not None and not mine.determined and mine.how.startswith("0") and theirs and theirs.determined:
            fits[phase].call_ms = fits[other].call_ms
            index = fits[phase].sources.index(mine)
            fits[phase].sources[index] = CostSource(cost=mine.cost, determined=False, hint=mine.hint,
                                                    how=f"the {_name(other)}'s call cost")  # fmt: skip
    return efficiency, {phase: fits[phase].call_ms for phase in PHASES}


def _source(fit: PhaseFit, cost: str) -> CostSource | None:
    return next((s for s in fit.sources if s.cost == cost), None)


def _name(phase: str) -> str:
    return "forward" if phase == "fwd" else "backward"


__all__ = ["SINGULAR_TOLERANCE", "CostSource", "PhaseFit", "complete", "determined", "fit_phase"]
