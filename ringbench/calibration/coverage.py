"""What a calibration measured, and what a prediction from it extrapolates (said out loud, never silently).

``coverage(views, table, calibration)`` records what the calibration run measured: phases, dtypes, device, kernels,
heads x head dims, computed GFLOP per kernel call per mask kind (the block sizes), message sizes, link classes,
buffers. ``extrapolation(calibration, cases, cluster, costs)`` compares a prediction's cases with it, aspect by
aspect, and says how the model treats what was not measured: a cost from a prior (``Calibration.sources``), a
block or message size outside the measured range, a link class priced from the topology's nominal figures, a
dtype or device the run did not have. ``ringbench simulate --from`` prints it; meta.json keeps it under
``simulation.extrapolation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ringbench.kernels.base import block_flops
from ringbench.simulate.costs import KINDS

OUT_OF_RANGE = 1.5
"""A size more than this factor outside the measured range is called extrapolated."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Extrapolation:
    """One aspect of a prediction against its calibration."""

    aspect: str
    measured: str
    """What the calibration run measured."""
    predicted: str
    """What the prediction asks for."""
    treatment: str
    """How the model prices it."""
    assumed: bool
    """True when a prior or an extrapolation stands in for a measurement."""

    def to_dict(self) -> dict:
        return {"aspect": self.aspect, "measured": self.measured, "predicted": self.predicted,
                "treatment": self.treatment, "assumed": self.assumed}  # fmt: skip


def _values(cases: pd.DataFrame, column: str) -> list:
    return sorted({v for v in cases[column].dropna().tolist()}) if column in cases else []


def coverage(views, table: pd.DataFrame, calibration) -> dict:
    """What the calibration run measured (JSON-ready; ``Calibration.coverage``); ``views``: the run's
    (run_views.py)."""
    run, xfers = views.run, views.transfers
    cases = run.cases.drop_duplicates("case_id")
    meta = run.meta
    per_call: dict[str, list[float]] = {}
    for kind in KINDS:
        column = table[f"gflop_{kind}"] / table["calls"]
        values = column[table[f"gflop_{kind}"] > 0]
        if len(values):
            per_call[kind] = [float(values.min()), float(values.max())]
    nbytes = sorted({int(b) for b in xfers["bytes"]}) if len(xfers) else []
    kernels = _values(cases, "kernel")
    cores = meta.get("cpu_count")
    real_worlds = (
        [int(w) for w in cases.loc[cases["emulated_gflops"].isna(), "world"]] if "emulated_gflops" in cases else []
    )
    return {
        "phases": sorted({str(p) for p in table["phase"]}, key=["fwd", "bwd"].index),
        "dtypes": [str(v) for v in _values(cases, "dtype")],
        "device_kind": str(meta.get("device_kind") or "unknown"),
        "backend": str(meta.get("backend") or "unknown"),
        "cpu_count": int(cores) if cores else None,
        "kernels": [str(k) for k in kernels],
        "emulated_gflops": sorted({float(r) for r in table["nominal"].dropna().map(lambda ms: 1e3 / ms)}),
        "worlds": [int(v) for v in _values(cases, "world")],
        "seqs": [int(v) for v in _values(cases, "seq")],
        "heads": [int(v) for v in _values(cases, "heads")],
        "head_dims": [int(v) for v in _values(cases, "head_dim")],
        "masks": [str(v) for v in _values(cases, "mask")],
        "layouts": [str(v) for v in _values(cases, "layout")],
        "buffers": [str(v) for v in _values(cases, "buffer")],
        "block_gflop": per_call,
        "message_bytes": nbytes,
        "links": sorted(calibration.link_fit),
        "emulated_links": bool(meta.get("emulated_links")),
        "topology": bool(meta.get("topology")),
        "oversubscribed": bool(
            cores and real_worlds and max(real_worlds) > int(cores) and meta.get("device_kind") == "cpu"
        ),
    }


def _span(values: Sequence[float], unit: str = "", fmt: str = ",.4g") -> str:
    if not values:
        return "none"
    low, high = min(values), max(values)
    return f"{low:{fmt}}{unit}" if low == high else f"{low:{fmt}}–{high:{fmt}}{unit}"


def _ratio(value: float, low: float, high: float) -> float:
    """How far ``value`` lies outside [low, high], as a factor (1.0 inside)."""
    if value > high:
        return value / high if high > 0 else np.inf
    if value < low:
        return low / value if value > 0 else np.inf
    return 1.0


def _case_blocks(case) -> dict[str, list[float]]:
    """Per mask kind, the computed GFLOP per kernel call of a case (forward) -- the sizes the kernel sees."""
    out: dict[str, list[float]] = {}
    per = block_flops(case.batch, case.heads, 1, 1, case.head_dim, 1.0, False) / 1e9
    for pair in case.classes().classes:
        for block in pair.blocks:
            out.setdefault(block.kind, []).append(per * block.work_pairs)
    return out


def extrapolation(calibration, cases: Sequence, cluster=None, costs=None) -> list[Extrapolation]:
    """Aspect by aspect, what the prediction of ``cases`` (SimCase) takes from the calibration and what it assumes."""
    if not cases:
        return []
    cov = calibration.coverage or {}
    costs = costs or calibration.costs
    sources = {source.cost: source for source in calibration.sources}
    emulated = calibration.family == "emulated"
    phases = sorted({p for case in cases for p in case.phases}, key=["fwd", "bwd"].index)
    return [
        _phases(cov, phases, sources),
        *_compute(calibration, cases, cluster, costs, cov, emulated),
        *_blocks(cases, cov, sources),
        *_call_costs(phases, cov, costs, sources),
        _messages(cases, cov),
        *_links(calibration, cases, cluster, costs, sources),
        *_buffers(cases, phases, cov, sources),
    ]


def _phases(cov: dict, phases: list[str], sources: dict) -> Extrapolation:
    """A backward the run did not measure is priced from the forward."""
    measured = cov.get("phases", [])
    missing = [p for p in phases if p not in measured]
    hows = list(dict.fromkeys(sources[c].how for p in missing for c in (f"compute.{p}.efficiency.full",
                              f"compute.{p}.call_ms") if c in sources))  # fmt: skip
    return Extrapolation(aspect="phases", measured=" + ".join(measured) or "none", predicted=" + ".join(phases),
                         treatment="; ".join(hows) if missing else "measured",
                         assumed=bool(missing))  # fmt: skip


def _compute(calibration, cases, cluster, costs, cov: dict, emulated: bool) -> list[Extrapolation]:
    """The compute rate (the calibration's device and kernel, unless --compute-tflops replaced it), the dtypes the
    run did not have, and the ranks sharing CPU cores."""
    rate = costs.gflops
    device = cov.get("device_kind", "unknown")
    kernels = ", ".join(cov.get("kernels", [])) or "unknown"
    if abs(rate - calibration.costs.gflops) > 1e-9 * rate:
        treatment, assumed = f"{_rate(rate)} per rank, as given (--compute-tflops); efficiencies as calibrated", True
    elif emulated:
        treatment = (f"{_rate(rate)} per rank: the emulated kernel's rate, for every dtype and device (the model "
                     "has no dtype; --compute-tflops sets the rate of the device you mean)")  # fmt: skip
        assumed = False
    else:
        treatment = f"{_rate(rate)} per rank: the real kernels' measured rate on {device}"
        assumed = False
    out = [Extrapolation(aspect="compute rate", measured=f"{kernels} on {device}", predicted=_rate(rate) + " per rank",
                         treatment=treatment, assumed=assumed)]  # fmt: skip
    out.extend(_dtypes(cases, cov, emulated))
    out.extend(_cores(cases, cluster, cov, emulated))
    return out


def _dtypes(cases, cov: dict, emulated: bool) -> list[Extrapolation]:
    """A dtype the run did not measure: its messages are priced at its bytes, its compute at the measured rate."""
    dtypes = sorted({case.dtype for case in cases})
    measured_dtypes = cov.get("dtypes", [])
    new = [d for d in dtypes if d not in measured_dtypes]
    if not new:
        return []
    return [Extrapolation(
        aspect="dtype", measured=", ".join(measured_dtypes), predicted=", ".join(dtypes),
        treatment=("messages priced at the predicted dtype's bytes; " + (
            "compute: the emulated model has no dtype" if emulated else
            f"compute: assumed the {', '.join(measured_dtypes)} time per FLOP (a {', '.join(new)} kernel's rate "
            "was not measured)")),
        assumed=not emulated,
    )]  # fmt: skip


def _cores(cases, cluster, cov: dict, emulated: bool) -> list[Extrapolation]:
    """Real compute on ranks that share CPU cores (in the calibration run, or in the predicted cluster)."""
    real = not emulated or any(case.family == "real" for case in cases)
    cores = getattr(cluster, "cpu_cores", None)
    if not (real and (cov.get("oversubscribed") or cores)):
        return []
    measured_cores = (f"real compute on up to {max(cov.get('worlds', [0]))} ranks sharing {cov.get('cpu_count')} "
                      "CPU cores" if cov.get("oversubscribed") else "a core per rank")  # fmt: skip
    shares = sorted({cluster.core_share(case.world) for case in cases}) if cores else [1.0]
    predicted = f"{max(case.world for case in cases)} ranks on {cores} cores" if cores else "a device per rank"
    return [Extrapolation(
        aspect="cores", measured=measured_cores, predicted=predicted,
        treatment=("real compute per core, stretched by the ranks sharing a core "
                   f"(x{', x'.join(f'{v:g}' for v in shares)}): the ranks take turns evenly while they compute"),
        assumed=True,
    )]  # fmt: skip


def _blocks(cases, cov: dict, sources: dict) -> list[Extrapolation]:
    """Block sizes per mask kind (what the kernel's rate was measured at) and the kinds' efficiencies."""
    blocks: dict[str, list[float]] = {}
    for case in cases:
        for kind, values in _case_blocks(case).items():
            blocks.setdefault(kind, []).extend(values)
    measured_blocks = cov.get("block_gflop", {})
    out = []
    for kind, values in sorted(blocks.items(), key=lambda item: KINDS.index(item[0])):
        got = measured_blocks.get(kind)
        prior = [sources[c] for c in sources if c.startswith("compute.") and c.endswith(f".efficiency.{kind}")
                 and not sources[c].determined]  # fmt: skip
        if got is None:
            treatment, assumed = prior[0].how if prior else "no blocks of this kind measured", True
        else:
            far = max(_ratio(v, got[0], got[1]) for v in values)
            if far > OUT_OF_RANGE:
                treatment = (f"extrapolated up to x{far:,.3g} beyond the measured sizes: the fitted time per FLOP "
                             "(and call cost) assumed to hold")  # fmt: skip
                assumed = True
            else:
                treatment, assumed = "within the measured sizes", False
            if prior:
                treatment += "; " + prior[0].how
                assumed = True
        out.append(Extrapolation(aspect=f"{kind} blocks (GFLOP per call)", predicted=_span(values),
                                 measured=_span(got) if got else "none", treatment=treatment,
                                 assumed=assumed))  # fmt: skip
    return out


def _call_costs(phases: list[str], cov: dict, costs, sources: dict) -> list[Extrapolation]:
    """A measured phase whose kernel call cost the fit could not separate from its time per FLOP."""
    measured = cov.get("phases", [])
    out = []
    for phase in phases:
        call = sources.get(f"compute.{phase}.call_ms")
        if call is not None and not call.determined and phase in measured:
            out.append(Extrapolation(aspect=f"{phase} kernel call cost", measured="not separable",
                                     predicted=f"{costs.call_ms.get(phase, 0.0):.3g} ms",
                                     treatment=f"{call.how}; to measure it: {call.hint}", assumed=True))  # fmt: skip
    return out


def _messages(cases, cov: dict) -> Extrapolation:
    """The ring's message sizes against the transfers the run measured."""
    sizes = sorted({case.block_bytes(lane) for case in cases for lane in (("kv", "dkv") if case.backward else ("kv",))})
    got_sizes = cov.get("message_bytes", [])
    far = max((_ratio(v, min(got_sizes), max(got_sizes)) for v in sizes), default=1.0) if got_sizes else np.inf
    return Extrapolation(
        aspect="messages (bytes)", measured=_span(got_sizes, fmt=","), predicted=_span(sizes, fmt=","),
        treatment="within the measured sizes" if far <= OUT_OF_RANGE else
        (f"extrapolated up to x{far:,.3g}: latency + bytes / bandwidth assumed to hold" if np.isfinite(far) else
         "no transfers measured: the links' defaults"),
        assumed=far > OUT_OF_RANGE,
    )  # fmt: skip


def _buffers(cases, phases: list[str], cov: dict, sources: dict) -> list[Extrapolation]:
    """The host gaps of a buffer the run did not measure come from another."""
    out = []
    for buffer in sorted({case.buffer for case in cases}):
        key = "sync" if buffer == "sync" else "double"
        priors = [sources[f"host.{p}.{key}"] for p in phases if f"host.{p}.{key}" in sources
                  and not sources[f"host.{p}.{key}"].determined]  # fmt: skip
        if priors:
            out.append(Extrapolation(aspect=f"host gaps ({buffer})", measured=", ".join(cov.get("buffers", [])),
                                     predicted=buffer, treatment="; ".join(p.how for p in priors),
                                     assumed=True))  # fmt: skip
    return out


def _links(calibration, cases, cluster, costs, sources) -> list[Extrapolation]:
    """Every link class the prediction uses, and where its cost comes from."""
    topology = getattr(cluster, "topology", None)
    local = sources.get("link.local")
    local_how = "measured" if local is None or local.determined else local.how
    if topology is None:
        return [Extrapolation(aspect="link local", measured=", ".join(calibration.coverage.get("links", [])) or "none",
                              predicted="local (no topology)", treatment=f"the calibration's local link: {local_how}",
                              assumed=local is not None and not local.determined)]  # fmt: skip
    from ringbench.topology.linkmodel import ring_links

    costs_of: dict[str, tuple[float, float]] = {}
    shared: dict[str, int] = {}
    for case in cases:
        if topology.world != case.world:
            continue
        links = ring_links(topology, case.ring)
        for p, label in enumerate(links.labels):
            costs_of.setdefault(label, (float(links.latency_us[p]), float(links.bandwidth_gbps[p])))
        for label, share in links.shared_classes().items():
            shared[label] = max(shared.get(label, 1), share)
    out = []
    for label, (latency, bandwidth) in sorted(costs_of.items()):
        share = f"; shared by up to {shared[label]} hops (NIC sharing)" if label in shared else ""
        if getattr(cluster, "emulate_links", False):
            treatment = (f"emulated: the topology's {latency:g} us + bytes / {bandwidth:g} GB/s as a delay after the "
                         f"local transport ({local_how}){share}")  # fmt: skip
            assumed = local is not None and not local.determined
        elif label in costs.links:
            treatment, assumed = f"measured on the calibration run{share}", False
        else:
            treatment = f"the topology's nominal {latency:g} us, {bandwidth:g} GB/s (not measured){share}"
            assumed = True
        out.append(Extrapolation(aspect=f"link {label}", measured=", ".join(calibration.coverage.get("links", [])),
                                 predicted=f"{label} hops", treatment=treatment, assumed=assumed))  # fmt: skip
    return out


def _rate(gflops: float) -> str:
    return f"{gflops / 1e3:,.4g} TFLOP/s" if gflops >= 1e3 else f"{gflops:,.4g} GFLOP/s"


__all__ = ["OUT_OF_RANGE", "Extrapolation", "coverage", "extrapolation"]
