"""Calibration: the simulator's costs measured on a run (real, emulated or imported).

compute   every compute span is one pair of the mask plan (plans.py): its kernel calls and computed FLOPs per
          mask kind are known. Per phase, the medians per (case, pair class) are fitted by non-negative least
          squares to  calls x call_ms + sum over kinds of GFLOP x ms_per_GFLOP x efficiency[kind]; the nominal
          ms per GFLOP is the emulated kernel's (1000 / its rate, as ``emulated:auto`` chose it) or, for real
          kernels, the run's own median. Ranks slowed by an injected fault are left out; every rank's ratio to
          the fit is reported (a slow rank shows up there).
links     each received block's transfer (recv end - max(both posts), ringbench.figures.critical_path.transfers),
          less the delay the run injected (emulated links, slow-link, half a jitter): latency + bytes /
          bandwidth fitted on the medians per message size, per link class when the run has a topology with
          real links, else as ``local``.
host      per phase and buffer the medians of the gaps between a step's events (engine.PhaseModel: enter,
          pre, mid, post).
noise     the coefficient of variation of compute spans and of transfers around their case medians (robust:
          1.4826 x MAD / median), the ranks' spread of iteration starts, the barrier's gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ringbench.errors import UsageError
from ringbench.kernels.base import block_flops
from ringbench.rank.faults import parse_fault
from ringbench.simulate.costs import DEFAULTS, HOST_STEPS, KINDS, PHASES, Costs, LinkCost
from ringbench.simulate.plans import pair_classes
from ringbench.vocab import Layout, Mask

MAX_SKEW_SAMPLES = 256
NOISE_QUANTILES = 65


@dataclass(kw_only=True)
class Calibration:
    """The fitted costs and how well they fit (for the table ``ringbench simulate --from`` prints)."""

    costs: Costs
    compute_fit: dict[str, dict] = field(default_factory=dict)
    """Per phase: spans used, median |residual| / measured."""
    link_fit: dict[str, dict] = field(default_factory=dict)
    """Per link class: transfers used, message sizes, latency, bandwidth."""
    rank_factors: dict[int, float] = field(default_factory=dict)
    """Per rank: median measured / fitted compute time (1.0: as fitted)."""
    excluded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"costs": self.costs.to_dict(), "compute_fit": self.compute_fit, "link_fit": self.link_fit,
                "rank_factors": {str(k): v for k, v in self.rank_factors.items()}, "excluded": self.excluded,
                "notes": self.notes}  # fmt: skip


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


def _saturated_cases(run) -> set[str]:
    """Cases whose emulated kernel calls outlasted their modelled time (cases column ``saturated_blocks``)."""
    if "saturated_blocks" not in run.cases:
        return set()
    blocks = pd.to_numeric(run.cases["saturated_blocks"], errors="coerce").fillna(0)
    return set(run.cases.loc[blocks > 0, "case_id"])


def _compute_table(run) -> pd.DataFrame:
    """One row per compute span: case, phase, rank, ms, nominal ms per GFLOP, calls and GFLOP per kind."""
    events = run.events
    comp = events[events["kind"] == "compute"]
    if comp.empty:
        raise UsageError(f"{run.path}: no compute spans to calibrate on (run without --no-trace)")
    frames = []
    for row in run.cases.drop_duplicates("case_id").to_dict("records"):
        spans = comp[comp["case_id"] == row["case_id"]]
        if spans.empty or str(row.get("buffer")) == "allgather":
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


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    scale = np.where(np.abs(a).max(axis=0) > 0, np.abs(a).max(axis=0), 1.0)
    x, _ = nnls(a / scale, b)
    return x / scale


def _fit_compute(table: pd.DataFrame, cal: Calibration) -> tuple[float, dict, dict]:
    """(nominal GFLOP/s, efficiency per phase and kind, call ms per phase)."""
    nominal = table["nominal"]
    if nominal.isna().all():  # real kernels: the run's own median rate over its largest kind is the nominal
        work = table[[f"gflop_{k}" for k in KINDS]].sum(axis=1)
        rate = float(np.median(work / (table["ms"] / 1e3)))
        table = table.assign(nominal=1e3 / rate)
        cal.notes.append(f"real kernels: nominal rate = the run's median {rate:,.0f} GFLOP/s")
    else:
        table = table.assign(nominal=table["nominal"].fillna(table["nominal"].median()))
    efficiency, call_ms = {}, {}
    for phase in PHASES:
        part = table[table["phase"] == phase]
        if part.empty:
            efficiency[phase], call_ms[phase] = dict(DEFAULTS.efficiency[phase]), 0.0
            continue
        groups = part.groupby(["case_id", "cls"], observed=True)
        med = groups.agg(ms=("ms", "median"), calls=("calls", "first"), nominal=("nominal", "first"),
                         **{f"g_{k}": (f"gflop_{k}", "first") for k in KINDS})  # fmt: skip
        present = [k for k in KINDS if (med[f"g_{k}"] > 0).any()]
        a = np.column_stack(
            [med["calls"].to_numpy(float)] + [(med[f"g_{k}"] * med["nominal"]).to_numpy() for k in present]
        )
        x = _nnls(a, med["ms"].to_numpy(float))
        call_ms[phase] = float(x[0])
        fitted = {k: float(v) for k, v in zip(present, x[1:], strict=True) if v > 0}
        fill = float(np.mean(list(fitted.values()))) if fitted else 1.0
        efficiency[phase] = {k: fitted.get(k, fill) for k in KINDS}
        predicted = a @ x
        cal.compute_fit[phase] = {
            "spans": len(part), "groups": len(med),
            "median_rel_residual": float(np.median(np.abs(predicted - med["ms"]) / med["ms"].clip(lower=1e-9))),
        }  # fmt: skip
    return float(1e3 / table["nominal"].median()), efficiency, call_ms


def _rank_factors(table: pd.DataFrame, efficiency: dict, call_ms: dict) -> dict[int, float]:
    predicted = table["calls"] * table["phase"].map(call_ms)
    for kind in KINDS:
        eff = table["phase"].map({phase: efficiency[phase][kind] for phase in efficiency})
        predicted = predicted + table[f"gflop_{kind}"] * table["nominal"] * eff
    ratio = table["ms"] / predicted.where(predicted > 0)
    return {int(r): float(v) for r, v in ratio.groupby(table["rank"]).median().items()}


def _injected_ms(run, xfers: pd.DataFrame) -> np.ndarray:
    """Per transfer: the delay the run added after it (emulated links, slow-link, half a jitter), ms."""
    extra = np.zeros(len(xfers))
    for spec in run.meta.get("faults") or []:
        fault = parse_fault(spec)
        if fault.kind == "slow-link":
            extra += np.where((xfers["src"] == fault.src) & (xfers["dst"] == fault.dst), fault.ms, 0.0)
        elif fault.kind == "jitter":
            extra += fault.ms / 2
    topology = _topology(run)
    if topology is not None and run.meta.get("emulated_links"):
        from ringbench.simulate.case import _shares
        from ringbench.topology import LinkKind

        for case_id, part in xfers.groupby("case_id", sort=False):
            ring = _ring_of(run, case_id)
            if ring is None or len(ring) != topology.world:
                continue
            src, dst = np.roll(ring, 1), ring
            net = np.array([topology.link(int(a), int(b)).kind is LinkKind.NET for a, b in zip(src, dst, strict=True)])
            shares = dict(zip(zip(src.tolist(), dst.tolist(), strict=True),
                              _shares(_hosts(topology), src, dst, net), strict=True))  # fmt: skip
            for index, row in zip(part.index, part.itertuples(), strict=True):
                link = topology.link(int(row.src), int(row.dst))
                latency_us, bandwidth = topology.cost_model.latency_bandwidth(link)
                share = shares.get((int(row.src), int(row.dst)), 1.0)
                extra[xfers.index.get_loc(index)] += (latency_us + row.bytes / (bandwidth / share * 1e3)) / 1e3
    return extra


def _topology(run):
    document = run.meta.get("topology")
    if not document:
        return None
    from ringbench.topology import Topology

    return Topology.from_dict(document, "meta.json:topology")


def _hosts(topology) -> np.ndarray:
    names = [d.host for d in topology.devices]
    order = {name: i for i, name in enumerate(dict.fromkeys(names))}
    return np.array([order[n] for n in names])


def _ring_of(run, case_id: str) -> np.ndarray | None:
    rows = run.cases.loc[run.cases["case_id"] == case_id, "ring"]
    if rows.empty:
        return None
    return np.array([int(r) for r in str(rows.iloc[0]).split("-")])


def _fit_links(run, cal: Calibration) -> dict[str, LinkCost]:
    from ringbench.figures.critical_path import transfers

    xfers = transfers(run.events)
    xfers = xfers[xfers["transfer_ms"].notna() & (xfers["bytes"] > 0)]
    if xfers.empty:
        cal.notes.append("no transfers: links keep the defaults")
        return dict(DEFAULTS.links)
    base = xfers["transfer_ms"].to_numpy() - _injected_ms(run, xfers)
    xfers = xfers.assign(base_ms=np.clip(base, 1e-6, None))
    topology = _topology(run)
    if topology is not None and not run.meta.get("emulated_links"):
        labels = [topology.link(int(a), int(b)).label for a, b in zip(xfers["src"], xfers["dst"], strict=True)]
        xfers = xfers.assign(link_class=labels)
    else:
        xfers = xfers.assign(link_class="local")
    links = {}
    for label, part in xfers.groupby("link_class", sort=True):
        sizes = part.groupby("bytes")["base_ms"].median()
        if len(sizes) >= 2:
            slope, intercept = np.polyfit(sizes.index.to_numpy(float), sizes.to_numpy(), 1)
            slope, intercept = max(slope, 1e-15), max(intercept, 0.0)
        else:  # one message size: latency and bandwidth are not separable; all of it is bandwidth
            slope, intercept = float(sizes.iloc[0]) / float(sizes.index[0]), 0.0
            cal.notes.append(f"{label}: one message size ({int(sizes.index[0]):,} B): latency folded into bandwidth")
        links[str(label)] = LinkCost(latency_us=intercept * 1e3, bandwidth_gbps=1.0 / (slope * 1e6))
        cal.link_fit[str(label)] = {"transfers": len(part), "sizes": [int(s) for s in sizes.index],
                                    "median_ms": [float(v) for v in sizes], "latency_us": intercept * 1e3,
                                    "bandwidth_gbps": 1.0 / (slope * 1e6)}  # fmt: skip
    if "local" not in links:
        links["local"] = min(links.values(), key=lambda c: c.ms(1 << 20))
    return links


def _host_steps(run) -> dict:
    """Per phase and buffer: medians of enter, pre, mid and post (engine.PhaseModel)."""
    from ringbench.figures.critical_path import transfers

    events = run.events
    xfers = transfers(events)
    keys = ["case_id", "repeat", "iteration", "phase", "rank"]
    comp = events[events["kind"] == "compute"][[*keys, "step", "start_ns", "end_ns"]]
    it = events[events["kind"] == "iteration"][[*keys, "start_ns"]].rename(columns={"start_ns": "phase_ns"})
    buffers = run.cases.drop_duplicates("case_id").set_index("case_id")["buffer"]
    posts = xfers.rename(columns={"dst": "rank"})[[*keys, "step", "exchange", "recv_start_ns", "wait_end_ns"]]
    out = {phase: {b: {} for b in ("sync", "double")} for phase in PHASES}
    for (case_id, phase), part in comp.groupby(["case_id", "phase"], sort=False):
        buffer = str(buffers.get(case_id, "double"))
        if buffer not in ("sync", "double"):
            continue
        kv = posts[(posts["case_id"] == case_id) & (posts["phase"] == phase) & (posts["exchange"] == "kv")]
        dkv = posts[(posts["case_id"] == case_id) & (posts["phase"] == phase) & (posts["exchange"] == "dkv")]
        merged = part.merge(kv, on=[*keys, "step"], how="left")
        values = out[phase][buffer]
        first = merged[merged["step"] == 0].merge(it, on=keys)  # step 0: double posts first, sync computes first
        enter = first["recv_start_ns"] if buffer == "double" else first["start_ns"]
        values.setdefault("enter_ms", []).extend(((enter - first["phase_ns"]) / 1e6).dropna().tolist())
        if buffer == "double":
            pre = merged["start_ns"] - merged["recv_start_ns"]
            nxt = kv.assign(step=kv["step"] - 1)[[*keys, "step", "recv_start_ns"]]
            after = kv.merge(nxt, on=[*keys, "step"], suffixes=("", "_next"))
            post = after["recv_start_ns_next"] - after["wait_end_ns"]
        else:
            pre = merged["start_ns"] - merged["wait_end_ns"]
            ends = part[[*keys, "step", "end_ns"]]
            if phase == "bwd" and not dkv.empty:
                ends = dkv[[*keys, "step", "wait_end_ns"]].rename(columns={"wait_end_ns": "end_ns"})
            nxt = kv.assign(step=kv["step"] - 1)[[*keys, "step", "recv_start_ns"]]
            post = ends.merge(nxt, on=[*keys, "step"])
            post = post["recv_start_ns"] - post["end_ns"]
        if phase == "bwd" and not dkv.empty:
            if buffer == "double":  # dK/dV post after the previous dK/dV wait (or the compute at step 0)
                prev = dkv.assign(step=dkv["step"] + 1)[[*keys, "step", "wait_end_ns"]]
                mid = part.merge(dkv[[*keys, "step", "recv_start_ns"]], on=[*keys, "step"]).merge(
                    prev, on=[*keys, "step"], how="left"
                )
                anchor = mid["wait_end_ns"].where(mid["wait_end_ns"].notna(), mid["end_ns"])
                mid = mid["recv_start_ns"] - np.maximum(anchor, mid["end_ns"])
            else:
                mid = part.merge(dkv[[*keys, "step", "recv_start_ns"]], on=[*keys, "step"])
                mid = mid["recv_start_ns"] - mid["end_ns"]
            values.setdefault("mid_ms", []).extend((mid / 1e6).dropna().tolist())
        values.setdefault("pre_ms", []).extend((pre / 1e6).dropna().tolist())
        values.setdefault("post_ms", []).extend((post / 1e6).dropna().tolist())
    host = {}
    for phase in PHASES:
        host[phase] = {}
        for buffer in ("sync", "double"):
            got = out[phase][buffer]
            host[phase][buffer] = {name: float(max(np.median(got[name]), 0.0)) if got.get(name) else
                                   DEFAULTS.host(phase, buffer)[name] for name in HOST_STEPS}  # fmt: skip
            if buffer == "sync" and got.get("enter_ms"):  # sync's step 0 computes first: enter holds pre too
                values = host[phase][buffer]
                values["enter_ms"] = max(values["enter_ms"] - values["pre_ms"], 0.0)
    return host


def _ratios(values: pd.Series, by: pd.Series) -> np.ndarray:
    med = values.groupby(by).transform("median")
    return (values / med.where(med > 0)).dropna().to_numpy(float)


def _noise(run, table: pd.DataFrame) -> dict:
    """Compute and transfer times around their medians (CV and NOISE_QUANTILES quantiles), the ranks' spread of
    iteration starts, the barrier's gap."""
    from ringbench.figures.critical_path import transfers

    out = {}
    xfers = transfers(run.events)
    groups = {"compute": (table["ms"], table["case_id"] + table["phase"] + table["cls"].astype(str))}
    if len(xfers):
        groups["link"] = (xfers["transfer_ms"], xfers["case_id"] + xfers["phase"] + xfers["exchange"])
    for name, (values, by) in groups.items():
        rel = _ratios(values, by)
        out[f"{name}_cv"] = float(1.4826 * np.median(np.abs(rel - 1.0))) if len(rel) else 0.0
        levels = np.linspace(0, 1, NOISE_QUANTILES)
        out[f"{name}_noise"] = tuple(float(v) for v in np.quantile(rel, levels)) if len(rel) >= 20 else ()
    it = run.events[run.events["kind"] == "iteration"]
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


def calibrate(run) -> Calibration:
    """Fit the simulator's costs on a run (a RunData; ringbench.record.store.load_run)."""
    if run.meta.get("simulated"):
        raise UsageError(f"{run.path}: a SIMULATED record; calibrate on a measured run (run, emulated or imported)")
    cal = Calibration(costs=DEFAULTS)
    from ringbench.simulate.strategy_fit import fit_strategy_overheads, ring_cases

    full_run, (run, others) = run, ring_cases(run)  # a Ulysses block or an all-to-all chunk is no ring pair nor hop
    if others:
        cal.excluded.append(f"{len(others)} case(s) of other strategies (ulysses, hybrid, double ring): not in the "
                            "ring's fit; their own host time per event is fitted on them")  # fmt: skip
        if not len(run.cases):
            raise UsageError(f"{run.path}: no ring case to calibrate on; calibrate on a run with --strategy ring")
    table = _compute_table(run)
    world = int(run.cases["world"].max())
    topology = _topology(run)
    slow = _slow_ranks(run, world, _hosts(topology) if topology is not None else None)
    if slow:
        cal.excluded.append(f"ranks {sorted(slow)} (injected slow-rank / slow-host faults): not in the compute fit")
    fit_table = table[~table["rank"].isin(slow)]
    kernels = run.cases.drop_duplicates("case_id").set_index("case_id").get("emulated")
    if kernels is not None and kernels.fillna(False).astype(bool).nunique() > 1:
        # One machine model per calibration: real kernels run at the machine's rate, emulated ones at the model's.
        modelled = set(kernels[kernels.fillna(False).astype(bool)].index.astype(str))
        real = fit_table.loc[~fit_table["case_id"].astype(str).isin(modelled), "case_id"].nunique()
        cal.excluded.append(f"{real} case(s) with real kernels: not in the compute fit (the run mixes real and "
                            "emulated compute; the fit follows the emulated cases)")  # fmt: skip
        fit_table = fit_table[fit_table["case_id"].astype(str).isin(modelled)]
        table = table[table["case_id"].astype(str).isin(modelled)]
    saturated = _saturated_cases(run)
    if saturated and len(saturated) < fit_table["case_id"].nunique():
        cal.excluded.append(f"{len(saturated)} case(s) with saturated emulated blocks: not in the compute fit "
                            "(their real arithmetic outlasted the modelled time)")  # fmt: skip
        fit_table = fit_table[~fit_table["case_id"].isin(saturated)]
    elif saturated:
        cal.notes.append("every case has saturated emulated blocks: the compute fit measures this machine's "
                         "arithmetic, not the emulated rate (use a lower rate or emulated:auto)")  # fmt: skip
    gflops, efficiency, call_ms = _fit_compute(fit_table, cal)
    table = table.assign(nominal=table["nominal"].fillna(1e3 / gflops))
    cal.rank_factors = _rank_factors(table, efficiency, call_ms)
    links = _fit_links(run, cal)
    cal.costs = Costs(gflops=gflops, efficiency=efficiency, call_ms=call_ms, host_ms=_host_steps(run), links=links,
                      source=str(run.meta.get("run_id") or run.path), **_noise(run, fit_table))  # fmt: skip
    if others:  # the other strategies' own host time, beyond what the ring's costs predict for them
        from dataclasses import replace as _replace

        cal.costs = _replace(cal.costs, strategy_ms=fit_strategy_overheads(full_run, cal.costs, cal))
    return cal
