"""Calibration of the links: each received block's transfer, less the delay the run injected, per link class.

Each transfer (recv end - max of both posts, ringbench.figures.critical_path.transfers) less what the run added
after it (emulated links, slow-link, half a jitter), its bytes times its NIC share (topology/linkmodel.py): latency
+ bytes / bandwidth fitted on the medians per message size, per link class when the run has a topology with real
links, else ``local``. One message size: latency 0, its whole time taken as bandwidth (a stated prior). A run of
the all-gather baseline only has no ring transfers: its collectives give a ring estimate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ringbench.scenario.faults import parse_fault
from ringbench.simulate.costs import DEFAULTS, CostSource, LinkCost


def _hop_table(run, topology, xfers: pd.DataFrame) -> pd.DataFrame:
    """Per transfer, from the link model of the run's topology (topology/linkmodel.py): its class, its NIC share
    and the delay an emulated link injected after it (us); ``local`` / 1 / 0 without a topology."""
    out = pd.DataFrame({"link_class": "local", "share": 1.0, "emulated_us": 0.0}, index=xfers.index)
    if topology is None:
        return out
    from ringbench.topology.linkmodel import ring_links

    emulated = bool(run.meta.get("emulated_links"))
    for case_id, part in xfers.groupby("case_id", sort=False):
        ring = ring_of(run, case_id)
        if ring is None or len(ring) != topology.world or len(ring) < 2:
            continue
        links = ring_links(topology, ring)
        hop = {(int(a), int(b)): p for p, (a, b) in enumerate(zip(links.src, links.dst, strict=True))}
        position = [hop.get((int(a), int(b))) for a, b in zip(part["src"], part["dst"], strict=True)]
        known = [p is not None for p in position]
        index = part.index[known]
        position = np.array([p for p in position if p is not None], dtype=np.int64)
        if emulated:  # the transport is local; the topology's cost was a delay after it
            out.loc[index, "emulated_us"] = links.transfer_us(part.loc[index, "bytes"].to_numpy(float)[:, None]
                                                              )[np.arange(len(position)), position]  # fmt: skip
        else:
            out.loc[index, "link_class"] = [links.labels[p] for p in position]
            out.loc[index, "share"] = links.shares[position]
    return out


def _injected_ms(run, xfers: pd.DataFrame, hops: pd.DataFrame) -> np.ndarray:
    """Per transfer: the delay the run added after it (emulated links, slow-link, half a jitter), ms."""
    extra = hops["emulated_us"].to_numpy(float) / 1e3
    for spec in run.meta.get("faults") or []:
        fault = parse_fault(spec)
        if fault.kind == "slow-link":
            extra = extra + np.where((xfers["src"] == fault.src) & (xfers["dst"] == fault.dst), fault.ms, 0.0)
        elif fault.kind == "jitter":
            extra = extra + fault.ms / 2
    return extra


def host_index(topology) -> np.ndarray:
    """(N,) each rank's host as an index (hosts in order of first appearance)."""
    names = [d.host for d in topology.devices]
    order = {name: i for i, name in enumerate(dict.fromkeys(names))}
    return np.array([order[n] for n in names])


def ring_of(run, case_id: str) -> np.ndarray | None:
    rows = run.cases.loc[run.cases["case_id"] == case_id, "ring"]
    if rows.empty:
        return None
    return np.array([int(r) for r in str(rows.iloc[0]).split("-")])


def fit_links(views, cal) -> dict[str, LinkCost]:
    """Per link class, the latency and bandwidth of the run's transfers (``views``: the run's, run_views.py)."""
    run, xfers = views.run, views.transfers
    xfers = xfers[xfers["transfer_ms"].notna() & (xfers["bytes"] > 0)]
    if xfers.empty:
        gathered = _allgather_link(run, cal)
        if gathered is not None:
            return {"local": gathered}
        cal.notes.append("no transfers: links keep the defaults")
        cal.sources.append(CostSource(cost="link.local", determined=False, how="the documented default (no "
                                      "transfers recorded)", hint="calibrate on a run of 2 or more ranks"))  # fmt: skip
        return dict(DEFAULTS.links)
    hops = _hop_table(run, views.topology, xfers)
    base = xfers["transfer_ms"].to_numpy() - _injected_ms(run, xfers, hops)
    # A NET hop sharing its host pair's link moved bytes x share at the link's own bandwidth (topology/linkmodel.py).
    xfers = xfers.assign(base_ms=np.clip(base, 1e-6, None), link_class=hops["link_class"],
                         moved=xfers["bytes"] * hops["share"])  # fmt: skip
    links = {}
    for label, part in xfers.groupby("link_class", sort=True):
        sizes = part.groupby("moved")["base_ms"].median()
        what = "loopback transport" if label == "local" else f"{label} links"
        if len(sizes) >= 2:
            slope, intercept = np.polyfit(sizes.index.to_numpy(float), sizes.to_numpy(), 1)
            slope, intercept = max(slope, 1e-15), max(intercept, 0.0)
            cal.sources.append(CostSource(cost=f"link.{label}", determined=True,
                                          how=f"latency and bandwidth fitted on {len(sizes)} message sizes "
                                          f"({what})"))  # fmt: skip
        else:  # one message size: latency and bandwidth are not separable; all of it is taken as bandwidth
            # (measured on 2 loaded cores: loopback blocks of 1 MB, 512 KB and 256 KB took 9.5, 3-5 and 3.5 ms, closer
            # to a time in proportion to the bytes than to a nominal bandwidth with the rest as latency)
            nbytes, ms = float(sizes.index[0]), float(sizes.iloc[0])
            slope, intercept = ms / nbytes, 0.0
            cal.notes.append(f"{label}: one message size ({int(nbytes):,} B): latency and bandwidth not separable")
            cal.sources.append(CostSource(cost=f"link.{label}", determined=False,
                                          how=f"latency 0: one message size ({int(nbytes):,} B, {ms:.3g} ms) measured on "
                                          f"the {what}, its whole time taken as bandwidth",
                                          hint="two message sizes (two --seq values) separate latency from "
                                          "bandwidth"))  # fmt: skip
        links[str(label)] = LinkCost(latency_us=intercept * 1e3, bandwidth_gbps=1.0 / (slope * 1e6))
        cal.link_fit[str(label)] = {"transfers": len(part), "sizes": [int(s) for s in sizes.index],
                                    "median_ms": [float(v) for v in sizes], "latency_us": intercept * 1e3,
                                    "bandwidth_gbps": 1.0 / (slope * 1e6)}  # fmt: skip
    if "local" not in links:
        links["local"] = min(links.values(), key=lambda c: c.ms(1 << 20))
    return links


def _allgather_link(run, cal) -> LinkCost | None:
    """The local link from a run's all-gather collectives (the all-gather baseline: no ring transfers): a ring
    all-gather moves N - 1 blocks, so one block's transfer is (end - the last rank's start) / (N - 1)."""
    events = run.events
    coll = events[(events["kind"] == "collective") & (events["phase"] == "fwd") & (events["bytes"] > 0)]
    if coll.empty:
        return None
    worlds = run.cases.drop_duplicates("case_id").set_index("case_id")["world"]
    keys = ["case_id", "repeat", "iteration", "step"]
    per = coll.groupby(keys).agg(start=("start_ns", "max"), end=("end_ns", "max"), nbytes=("bytes", "first"))
    hops = per.index.get_level_values("case_id").map(worlds).to_numpy(float) - 1
    per = per[hops > 0].assign(block_ms=lambda f: (f["end"] - f["start"]) / 1e6 / hops[hops > 0])
    if per.empty:
        return None
    sizes = per.groupby("nbytes")["block_ms"].median()
    ms, nbytes = float(sizes.iloc[-1]), float(sizes.index[-1])
    cal.sources.append(CostSource(cost="link.local", determined=False,
                                  how=f"latency 0, bandwidth from the all-gather collectives ({len(per)} measured, "
                                  "a ring estimate of N - 1 blocks each)",
                                  hint="calibrate on a ring buffer (--buffer double or sync) for per-step transfers"))  # fmt: skip
    cal.link_fit["local"] = {"transfers": len(per), "sizes": [int(nbytes)], "median_ms": [ms], "latency_us": 0.0,
                             "bandwidth_gbps": nbytes / (max(ms, 1e-9) * 1e6), "from": "allgather"}  # fmt: skip
    return LinkCost(latency_us=0.0, bandwidth_gbps=nbytes / (max(ms, 1e-9) * 1e6))


__all__ = ["fit_links", "host_index", "ring_of"]
