"""Calibration of the host: the gaps between a ring step's events, per phase and buffer (phase_ring.PhaseModel).

enter (the phase's start to the first post), pre (the step's start to the compute), mid (the backward's compute
end to the dK/dV post), post (the step's last event to the next start): medians of what the run measured; a buffer
or phase it did not run takes the other buffer's, then the other phase's figures (stated priors).
"""

from __future__ import annotations

import numpy as np

from ringbench.simulate.costs import DEFAULTS, HOST_STEPS, PHASES, CostSource


def host_steps(views, sources: list[CostSource]) -> dict:
    """Per phase and buffer: medians of enter, pre, mid and post (simulate.phase_ring.PhaseModel), priors where not
    measured; ``views``: the run's (run_views.py)."""
    run, xfers = views.run, views.transfers
    events = run.events
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
    measured: dict[tuple[str, str], dict[str, float]] = {}
    for phase in PHASES:
        for buffer in ("sync", "double"):
            got = out[phase][buffer]
            if not got.get("pre_ms"):
                continue
            values = {name: float(max(np.median(got[name]), 0.0)) for name in HOST_STEPS if got.get(name)}
            if buffer == "sync" and "enter_ms" in values:  # sync's step 0 computes first: enter holds pre too
                values["enter_ms"] = max(values["enter_ms"] - values["pre_ms"], 0.0)
            measured[(phase, buffer)] = values
    return _complete_host(measured, sources)


def _complete_host(measured: dict[tuple[str, str], dict[str, float]], sources: list[CostSource]) -> dict:
    """Every (phase, buffer): measured gaps, else the other buffer's, then the other phase's (stated priors)."""
    host: dict = {phase: {} for phase in PHASES}
    for phase in PHASES:
        for buffer in ("sync", "double"):
            other_phase = "bwd" if phase == "fwd" else "fwd"
            other_buffer = "double" if buffer == "sync" else "sync"
            order = [(phase, buffer), (phase, other_buffer), (other_phase, buffer), (other_phase, other_buffer)]
            found = next((key for key in order if key in measured), None)
            values = dict(measured.get(found, {}))
            if "mid_ms" not in values:  # only a backward has the gap before its dK/dV post
                mid = next((measured[key]["mid_ms"] for key in order if "mid_ms" in measured.get(key, {})), None)
                values["mid_ms"] = (
                    mid if mid is not None else values.get("pre_ms", DEFAULTS.host(phase, buffer)["mid_ms"])
                )
            host[phase][buffer] = {name: values.get(name, DEFAULTS.host(phase, buffer)[name]) for name in HOST_STEPS}
            cost = f"host.{phase}.{buffer}"
            if found == (phase, buffer):
                sources.append(
                    CostSource(cost=cost, determined=True, how="medians of the gaps between a step's events")
                )
            else:
                how = (f"the {_phase_name(found[0])} {found[1]} figures ({_phase_name(phase)} {buffer} not measured)"
                       if found is not None else "the documented defaults (nothing measured)")  # fmt: skip
                sources.append(CostSource(cost=cost, determined=False, how=how,
                                          hint=f"calibrate on a run with --buffer {buffer}"
                                          + (" and the backward" if phase == "bwd" else "")))  # fmt: skip
    return host


def _phase_name(phase: str) -> str:
    return "forward" if phase == "fwd" else "backward"


__all__ = ["host_steps"]
