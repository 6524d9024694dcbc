"""Calibration: the simulator's costs measured on a run (real, emulated or imported), each with its source.

compute   every compute span is one pair of the mask plan (plans.py): its kernel calls and computed FLOPs per
          mask kind are known. Per phase and kernel family (emulated, real), the medians per (case, pair class)
          are fitted to  calls x call_ms + sum over kinds of GFLOP x ms_per_GFLOP x efficiency[kind]  where the
          run determines them (identify.py), with stated priors where it does not. The nominal ms per GFLOP is
          the emulated kernel's (1000 / its rate) or, for real kernels, the run's own median. Ranks slowed by an
          injected fault are left out; every rank's ratio to the fit is reported (a slow rank shows up there).
links     (calibrate_links.py) each received block's transfer, less the delay the run injected, its bytes times
          its NIC share: latency + bytes / bandwidth per message size and link class; one size: latency 0 (a prior)
host      (calibrate_host.py) the medians of the gaps between a step's events per phase and buffer; what the run
          did not measure: the other buffer's, then the other phase's figures
noise     the coefficient of variation of compute spans and of transfers around their case medians (robust:
          1.4826 x MAD / median), the ranks' spread of iteration starts, the barrier's gap.

``Calibration.sources`` says, cost by cost, whether the run determined it or a prior stands in (and what run would
determine it); ``Calibration.coverage`` what the run measured (phases, dtypes, device, kernels, block sizes,
message sizes, links), so a prediction can say what it extrapolates (coverage.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ringbench.calibration.calibrate_host import host_steps
from ringbench.calibration.calibrate_links import fit_links, host_index
from ringbench.calibration.identify import CostSource, PhaseFit, complete, fit_phase
from ringbench.calibration.run_views import RunViews, run_views
from ringbench.errors import UsageError
from ringbench.kernels.base import block_flops
from ringbench.scenario.faults import parse_fault
from ringbench.simulate.costs import DEFAULTS, KINDS, PHASES, Costs
from ringbench.simulate.pair_classes import pair_classes
from ringbench.vocab import Layout, Mask

MAX_SKEW_SAMPLES = 256
NOISE_QUANTILES = 65


@dataclass(kw_only=True)
class Calibration:
    """The fitted costs, where each came from, what the run measured, and how well the costs fit."""

    costs: Costs
    """The costs of the run's compute model (its emulated cases when it mixes emulated and real kernels)."""
    compute_fit: dict[str, dict] = field(default_factory=dict)
    """Per phase: spans used, median |residual| / measured, the block sizes per kind."""
    link_fit: dict[str, dict] = field(default_factory=dict)
    """Per link class: transfers used, message sizes, latency, bandwidth."""
    rank_factors: dict[int, float] = field(default_factory=dict)
    """Per rank: median measured / fitted compute time (1.0: as fitted)."""
    excluded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sources: list[CostSource] = field(default_factory=list)
    """Per cost: determined by the run, or a stated prior (with what run would determine it)."""
    coverage: dict = field(default_factory=dict)
    """What the run measured: phases, dtypes, device, kernels, block sizes, message sizes, links, buffers."""
    families: dict[str, Costs] = field(default_factory=dict)
    """Kernel family (``emulated``, ``real``) -> its costs, for a run that measured both."""
    family: str = "emulated"
    """The family ``costs`` belongs to."""

    def costs_for(self, family: str) -> Costs | None:
        """The costs of ``family`` (emulated or real compute), or None when the run measured none of it."""
        if family == self.family:
            return self.costs
        return self.families.get(family)

    def assumed(self) -> list[CostSource]:
        """The costs that came from a prior."""
        return [source for source in self.sources if not source.determined]

    def to_dict(self) -> dict:
        return {"costs": self.costs.to_dict(), "family": self.family,
                "families": {name: costs.to_dict() for name, costs in self.families.items()},
                "compute_fit": self.compute_fit, "link_fit": self.link_fit,
                "rank_factors": {str(k): v for k, v in self.rank_factors.items()}, "excluded": self.excluded,
                "notes": self.notes, "sources": [source.to_dict() for source in self.sources],
                "coverage": self.coverage}  # fmt: skip


def _case_rate(row: pd.Series) -> float | None:
    """The emulated kernel's rate of a case row (GFLOP/s), or None for a real kernel."""
    rate = row.get("emulated_gflops")
    if rate is not None and not (isinstance(rate, float) and math.isnan(rate)) and float(rate) > 0:
        return float(rate)
    name, _, argument = str(row.get("kernel", "")).partition(":")
    if name in ("emulated", "modelled", "simulated") and argument:
        try:
            return float(argument)
        except ValueError:
            return None
    return None


def _slow_ranks(run, world: int, hosts: np.ndarray | None) -> set[int]:
    slow: set[int] = set()
    for spec in run.meta.get("faults") or []:
        fault = parse_fault(spec)
        if fault.kind == "slow-rank":
            slow.add(fault.rank)
        elif fault.kind == "slow-host" and hosts is not None:
            slow.update(int(r) for r in np.flatnonzero(hosts == fault.host))
    return {r for r in slow if r < world}


SATURATION_SHARE = 0.05
"""A case whose emulated calls outlasted their modelled time more often than this did not run at the model's rate
(the share the analyses' confidence rules use, ringbench/analysis/confidence.py)."""


def _saturated_cases(run) -> set[str]:
    """Cases whose emulated kernel calls outlasted their modelled time in more than SATURATION_SHARE of them."""
    if "saturated_blocks" not in run.cases:
        return set()
    blocks = pd.to_numeric(run.cases["saturated_blocks"], errors="coerce").fillna(0)
    total = pd.to_numeric(run.cases.get("emulated_blocks", blocks), errors="coerce").fillna(0)
    late = (blocks > SATURATION_SHARE * total) if (total > 0).any() else blocks > 0
    return set(run.cases.loc[late & (blocks > 0), "case_id"].astype(str))


def _compute_table(run) -> pd.DataFrame:
    """One row per compute span: case, phase, rank, ms, nominal ms per GFLOP, calls and GFLOP per kind."""
    events = run.events
    comp = events[events["kind"] == "compute"]
    if comp.empty:
        raise UsageError(f"{run.path}: no compute spans to calibrate on (run without --no-trace)")
    frames = []
    for row in run.cases.drop_duplicates("case_id").to_dict("records"):
        spans = comp[comp["case_id"] == row["case_id"]]
        if spans.empty:
            continue
        world, seq = int(row["world"]), int(row["seq"])
        if str(row["mask"]) not in {m.value for m in Mask} or str(row["layout"]) not in {x.value for x in Layout}:
            frames.append(_recorded_work(row, spans))  # an imported ring: no mask plan, each span's own FLOPs
            continue
        classes = pair_classes(str(row["mask"]), str(row["layout"]), seq, world)
        index = classes.classify(spans["dst"].to_numpy(), spans["block"].to_numpy())
        rate = _case_rate(row)
        frame = pd.DataFrame({"case_id": row["case_id"], "phase": spans["phase"].to_numpy(),
                              "rank": spans["rank"].to_numpy(), "cls": index,
                              "ms": (spans["end_ns"] - spans["start_ns"]).to_numpy() / 1e6,
                              "nominal": 1e3 / rate if rate else np.nan})  # fmt: skip
        for phase in PHASES:
            backward = phase == "bwd"
            per_gflop = block_flops(int(row["batch"]), int(row["heads"]), 1, 1, int(row["head_dim"]), 1.0, backward)
            for c, pair in enumerate(classes.classes):
                mask = (frame["phase"] == phase).to_numpy() & (index == c)
                frame.loc[mask, "calls"] = len(pair.blocks)
                for kind, entries in pair.work_by_kind().items():
                    frame.loc[mask, f"gflop_{kind}"] = per_gflop * entries / 1e9
        frames.append(frame)
    if not frames:
        raise UsageError(f"{run.path}: no compute spans of its cases to calibrate on")
    return pd.concat(frames, ignore_index=True).fillna({f"gflop_{k}": 0.0 for k in KINDS})


def _recorded_work(row, spans: pd.DataFrame) -> pd.DataFrame:
    """Compute rows of a record without a mask plan (an imported trace): one call per span, its recorded FLOPs
    counted as full-block work (the profiler saw the op's shapes, not which of its entries a mask skipped)."""
    flops = pd.to_numeric(spans["flops"], errors="coerce").fillna(0.0).to_numpy()
    if not (flops > 0).any():
        raise UsageError(
            f"case {row['case_id']}: its compute spans carry no FLOPs (the trace was recorded without shapes); "
            "capture with record_shapes=True, or calibrate from a ringbench run"
        )
    rate = _case_rate(row)
    return pd.DataFrame({"case_id": row["case_id"], "phase": spans["phase"].to_numpy(),
                         "rank": spans["rank"].to_numpy(), "cls": 0,
                         "ms": (spans["end_ns"] - spans["start_ns"]).to_numpy() / 1e6,
                         "nominal": 1e3 / rate if rate else np.nan, "calls": 1.0,
                         **{f"gflop_{kind}": flops / 1e9 if kind == "full" else 0.0 for kind in KINDS}})  # fmt: skip


def _per_core(views: RunViews, rows: pd.DataFrame, cal: Calibration) -> pd.DataFrame:
    """Real compute of ranks that shared a CPU's cores, as one rank per core would run it: divided by ranks / cores
    (a prior: the ranks take turns evenly while they compute). The simulator stretches it back by the share of the
    machine it predicts (Cluster.cpu_cores)."""
    cores = views.cores
    if not cores:
        return rows
    worlds = views.run.cases.drop_duplicates("case_id").set_index("case_id")["world"].astype(float)
    share = np.maximum(1.0, rows["case_id"].map(worlds).to_numpy(float) / cores)
    if (share <= 1.0).all():
        return rows
    cal.sources.append(CostSource(cost="compute.cores", determined=False,
                                  how=f"real compute of up to {int(worlds.max())} ranks on {cores} CPU cores: the "
                                  f"spans divided by ranks / cores (up to x{share.max():g}; the ranks take turns "
                                  "evenly while they compute)",
                                  hint=f"calibrate on at most {cores} ranks (one core each)"))  # fmt: skip
    return rows.assign(ms=rows["ms"].to_numpy(float) / share)


def _seq_hint(run) -> str:
    """The run that would add a block size: the calibration run with another --seq (or `ringbench calibrate`)."""
    seqs = sorted({int(v) for v in run.cases["seq"]}) if "seq" in run.cases else []
    extra = f"--seq {seqs[0] // 2}" if seqs else "a second --seq"
    return f"add {extra} to the calibration run (or calibrate with `ringbench calibrate`)"


def _fit_family(table: pd.DataFrame, cal: Calibration, *, emulated: bool, seq_hint: str,
                prefix: str = "") -> tuple[float, dict, dict, list[CostSource]]:  # fmt: skip
    """(nominal GFLOP/s, efficiency per phase and kind, call ms per phase, sources) of one kernel family."""
    nominal = table["nominal"]
    if nominal.isna().all():  # real kernels: the run's own median rate over every kind is the nominal
        work = table[[f"gflop_{k}" for k in KINDS]].sum(axis=1)
        rate = float(np.median(work / (table["ms"] / 1e3)))
        table = table.assign(nominal=1e3 / rate)
        cal.notes.append(f"{prefix}real kernels: nominal rate = the run's median {rate:,.4g} GFLOP/s")
    else:
        table = table.assign(nominal=table["nominal"].fillna(table["nominal"].median()))
    fits: dict[str, PhaseFit] = {}
    for phase in PHASES:
        part = table[table["phase"] == phase]
        if not part.empty:
            fits[phase] = fit_phase(part, phase, emulated=emulated, seq_hint=seq_hint)
    efficiency, call_ms = complete(fits, emulated=emulated)
    sources = []
    for phase in PHASES:
        fit = fits[phase]
        sources.extend(CostSource(cost=prefix + src.cost, determined=src.determined, how=src.how, hint=src.hint)
                       for src in fit.sources)  # fmt: skip
        if fit.spans:
            cal.compute_fit[prefix + phase] = {
                "spans": fit.spans, "groups": fit.groups, "median_rel_residual": fit.median_rel_residual,
                "block_gflop": fit.sizes,
            }  # fmt: skip
    return float(1e3 / table["nominal"].median()), efficiency, call_ms, sources


def _rank_factors(table: pd.DataFrame, efficiency: dict, call_ms: dict) -> dict[int, float]:
    predicted = table["calls"] * table["phase"].map(call_ms)
    for kind in KINDS:
        eff = table["phase"].map({phase: efficiency[phase][kind] for phase in efficiency})
        predicted = predicted + table[f"gflop_{kind}"] * table["nominal"] * eff
    ratio = table["ms"] / predicted.where(predicted > 0)
    return {int(r): float(v) for r, v in ratio.groupby(table["rank"]).median().items()}


def _ratios(values: pd.Series, by: pd.Series) -> np.ndarray:
    med = values.groupby(by).transform("median")
    return (values / med.where(med > 0)).dropna().to_numpy(float)


def _noise(views: RunViews, table: pd.DataFrame) -> dict:
    """Compute and transfer times around their medians (CV and NOISE_QUANTILES quantiles), the ranks' spread of
    iteration starts, the barrier's gap."""
    out = {}
    xfers = views.transfers
    groups = {"compute": (table["ms"], table["case_id"] + table["phase"] + table["cls"].astype(str))}
    if len(xfers):
        groups["link"] = (xfers["transfer_ms"], xfers["case_id"] + xfers["phase"] + xfers["exchange"])
    for name, (values, by) in groups.items():
        rel = _ratios(values, by)
        out[f"{name}_cv"] = float(1.4826 * np.median(np.abs(rel - 1.0))) if len(rel) else 0.0
        levels = np.linspace(0, 1, NOISE_QUANTILES)
        out[f"{name}_noise"] = tuple(float(v) for v in np.quantile(rel, levels)) if len(rel) >= 20 else ()
    it = views.run.events[views.run.events["kind"] == "iteration"]
    fwd = it[it["phase"] == "fwd"]
    skew = (fwd["start_ns"] - fwd.groupby(["case_id", "repeat", "iteration"])["start_ns"].transform("min")) / 1e6
    samples = np.sort(skew.to_numpy(float))
    if len(samples) > MAX_SKEW_SAMPLES:
        samples = samples[np.linspace(0, len(samples) - 1, MAX_SKEW_SAMPLES).astype(int)]
    out["start_skew_ms"] = tuple(float(v) for v in samples) or (0.0,)
    per_it = it.groupby(["case_id", "repeat", "iteration"]).agg(start=("start_ns", "min"), end=("end_ns", "max"))
    gaps = (per_it["start"].shift(-1) - per_it["end"]).groupby(level=[0, 1]).apply(lambda s: s.iloc[:-1]) / 1e6
    out["gap_ms"] = max(float(np.median(gaps)), 0.0) if len(gaps) else DEFAULTS.gap_ms
    return out


def fit(run) -> Calibration:
    """Fit the simulator's costs on a run (a RunData; ringbench.record.store.load_run), each with its source.

    The run's views (its ring cases, transfers, topology, cores: run_views.py) are derived once and read by every
    part of the fit. A run that mixes emulated and real kernels gets one set of costs per family
    (``Calibration.families``): real kernels run at the machine's rate, emulated ones at the model's; ``costs`` is
    the emulated family's.
    """
    if run.meta.get("simulated"):
        raise UsageError(f"{run.path}: a SIMULATED record; calibrate on a measured run (run, emulated or imported)")
    cal = Calibration(costs=DEFAULTS)
    from ringbench.calibration.strategy_fit import fit_strategy_overheads

    views = run_views(run)  # a Ulysses block or an all-to-all chunk is no ring pair nor hop: the ring's cases
    full_run, run, others = run, views.run, views.others
    if others:
        cal.excluded.append(f"{len(others)} case(s) of other strategies (ulysses, hybrid, double ring): not in the "
                            "ring's fit; their own host time per event is fitted on them")  # fmt: skip
        if not len(run.cases):
            raise UsageError(f"{run.path}: no ring case to calibrate on; calibrate on a run with --strategy ring")
    table = _compute_table(run)
    world = int(run.cases["world"].max())
    topology = views.topology
    slow = _slow_ranks(run, world, host_index(topology) if topology is not None else None)
    if slow:
        cal.excluded.append(f"ranks {sorted(slow)} (injected slow-rank / slow-host faults): not in the compute fit")
    saturated = _saturated_cases(run)
    emulated_cases = set(table.loc[table["nominal"].notna(), "case_id"].astype(str))
    if saturated and emulated_cases - saturated:
        cal.excluded.append(f"{len(saturated & emulated_cases)} case(s) with saturated emulated blocks: not in the "
                            "compute fit (their real arithmetic outlasted the modelled time)")  # fmt: skip
        table = table[~table["case_id"].astype(str).isin(saturated)]
    nominal_holds = True
    if saturated and not emulated_cases - saturated:  # the times are this machine's, not the nominal rate's
        cal.notes.append("every emulated case has saturated blocks: the compute fit measures this machine's "
                         "arithmetic, not the emulated rate, and takes no prior from it (use a lower rate or "
                         "emulated:auto)")  # fmt: skip
        nominal_holds = False
    family_rows = {"emulated": table[table["nominal"].notna()], "real": table[table["nominal"].isna()]}
    family_rows = {name: rows for name, rows in family_rows.items() if len(rows)}
    primary = "emulated" if "emulated" in family_rows else "real"
    if len(family_rows) > 1:
        real = family_rows["real"]["case_id"].nunique()
        cal.notes.append(f"the run mixes real and emulated compute: {real} real-kernel case(s) calibrate the real "
                         "kernels' costs, the emulated cases the emulated model's")  # fmt: skip
    if "real" in family_rows:
        family_rows["real"] = _per_core(views, family_rows["real"], cal)
    hint = _seq_hint(run)
    fitted = {}
    for name, rows in family_rows.items():
        fit_rows = rows[~rows["rank"].isin(slow)]
        prefix = "" if name == primary else f"{name}."
        gflops, efficiency, call_ms, sources = _fit_family(fit_rows, cal, emulated=name == "emulated" and nominal_holds,
                                                           seq_hint=hint, prefix=prefix)  # fmt: skip
        cal.sources.extend(sources)
        fitted[name] = (gflops, efficiency, call_ms, fit_rows, rows)
    gflops, efficiency, call_ms, fit_rows, rows = fitted[primary]
    cal.rank_factors = _rank_factors(rows.assign(nominal=rows["nominal"].fillna(1e3 / gflops)), efficiency, call_ms)
    links = fit_links(views, cal)
    host = host_steps(views, cal.sources)
    source = str(run.meta.get("run_id") or run.path)
    for name, (gflops, efficiency, call_ms, fit_rows, _) in fitted.items():
        costs = Costs(gflops=gflops, efficiency=efficiency, call_ms=call_ms, host_ms=host, links=links,
                      source=source if name == primary else f"{source} ({name} kernels)",
                      **_noise(views, fit_rows))  # fmt: skip
        if name == primary:
            cal.costs = costs
        else:
            cal.families[name] = costs
    cal.family = primary
    from ringbench.calibration.coverage import coverage

    cal.coverage = coverage(views, table, cal)
    if others:  # the other strategies' own host time, beyond what the ring's costs predict for them
        from dataclasses import replace as _replace

        cal.costs = _replace(cal.costs, strategy_ms=fit_strategy_overheads(full_run, cal.costs, cal))
    return cal


calibrate = fit
"""The name docs/simulate.md's library example and the tests call the fit by (``ringbench.calibration.fit``)."""
