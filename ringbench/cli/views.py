"""The terminal views of the commands: their tables and lines, built from library results (no computation).

run: ``case_line`` (progress), ``summary_table``; simulate and calibrate: ``calibration_table``,
``extrapolation_table``, ``cases_table``, ``assumed_lines``, ``caveat_line``; plan: ``render_plan``,
``render_catalogue``.
"""

from __future__ import annotations

import math

from rich.table import Table

from ringbench.fmt import duration, exposed_text, number
from ringbench.scenario.axes import SHOWN_AXES


def _fmt(value: float, digits: int = 2) -> str:
    return number(value, f".{digits}f", missing="n/a")


def _nonfinite(row: dict) -> str:
    value = row.get("nonfinite")
    return value if isinstance(value, str) and value not in ("", "nan") else ""


def _kv_heads(row: dict) -> int | None:
    """The K/V heads of a cases row (0, or absent in an older record: as many as the heads; None without heads)."""
    value, heads = row.get("kv_heads"), row.get("heads")
    return int(value) if value is not None and value == value and int(value) else heads


def case_line(row: dict, done: int, total: int) -> str:
    """One finished case, for the progress stream."""
    label = " [emulated]" if row["emulated"] else ""
    check = "" if math.isnan(row["fwd_max_abs_err"]) else ("  check ok" if row["passed"] else "  CHECK FAILED")
    if _nonfinite(row):
        check = f"  CHECK FAILED (non-finite {_nonfinite(row)})"
    kernel = row["kernel"]
    rate = row.get("emulated_gflops")
    if kernel == "emulated:auto" and rate is not None and not math.isnan(rate):
        kernel += f" ({rate:g} GFLOP/s)"
    if row.get("impl", "ringbench") != "ringbench":
        kernel += f", impl {row['impl']}"
    strategy = str(row.get("strategy") or "ring")
    if strategy not in ("ring", "allgather"):
        kernel += f", {strategy}" + (f" @{row['placement']}" if row.get("placement") else "")
    if str(row.get("layers") or "1") != "1":
        kernel += f", layers {row['layers']}"
    if _kv_heads(row) != row.get("heads"):
        kernel += f", {row['heads']} heads / {_kv_heads(row)} KV"
    if row.get("check_note"):
        check += f" [{row['check_note']})"
    exposed = f"exposed comm {exposed_text(row['exposed_comm_frac'], row['world'])}"
    return (
        f"[{done}/{total}] {row['mask']}/{row['layout']}/{row['buffer']}/{row['order']} w={row['world']} "
        f"S={row['seq']} {kernel}{label}: step {_fmt(row['step_ms'])} ms "
        f"(p10 {_fmt(row['step_ms_p10'])}, p90 {_fmt(row['step_ms_p90'])}), {exposed}{check}"
    )


def summary_table(cases, emulated: bool, faults: list[str]) -> Table:
    """One row per (case, repeat); axes that are the same for every row go into the title."""
    varying = [axis for axis in SHOWN_AXES if axis in cases and cases[axis].astype(str).nunique() > 1]
    constant = [axis for axis in ("world", "seq", "heads", "head_dim", "dtype") if axis not in varying]
    first = cases.iloc[0]
    title = "ringbench run: " + ", ".join(f"{axis}={first[axis]}" for axis in constant)
    if emulated:
        title += "\n* EMULATED: compute time modelled by the emulated kernel, or links injected from a topology"
    if faults:
        title += f"\ninjected faults: {', '.join(faults)}"
    table = Table(title=title, title_justify="left")
    table.add_column("case")
    for name in ("step ms", "p10–p90", "exposed", "tok/s", "max err"):
        table.add_column(name, justify="right")
    shown = [axis for axis in varying if axis not in ("world", "seq", "heads", "head_dim", "dtype")] or ["mask"]
    for row in cases.to_dict("records"):
        parts = [f"kv{_kv_heads(row)}" if axis == "kv_heads" else str(row[axis]) for axis in shown]
        parts += [f"{axis[0]}{row[axis]}" for axis in ("world", "seq") if axis in varying]
        if int(row.get("repeat", 0)):
            parts.append(f"r{row['repeat']}")
        label = " ".join(parts) + (" *" if row["emulated"] else "")
        bwd = row["bwd_max_abs_err"] if not math.isnan(row["bwd_max_abs_err"]) else 0.0
        if _nonfinite(row):
            err_text = f"NaN in {_nonfinite(row)} FAIL"
        elif math.isnan(row["fwd_max_abs_err"]):
            err_text = "unchecked"
        else:
            err_text = f"{max(row['fwd_max_abs_err'], bwd):.1e}" + ("" if row["passed"] else " FAIL")
        exposed = exposed_text(row["exposed_comm_frac"], row["world"])
        table.add_row(
            label, _fmt(row["step_ms"]), f"{_fmt(row['step_ms_p10'], 1)}–{_fmt(row['step_ms_p90'], 1)}",
            exposed, f"{row['tokens_per_s']:,.0f}", err_text,
        )  # fmt: skip
    return table


def _source_cell(sources: dict, cost: str) -> str:
    source = sources.get(cost)
    if source is None:
        return ""
    return "measured" if source.determined else "ASSUMED"


def calibration_table(calibration) -> Table:
    """The fitted costs: compute per phase and kind, links per class, host gaps, noise; each marked measured or
    ASSUMED (a stated prior: the notes below the table say which and why)."""
    costs = calibration.costs
    sources = {source.cost: source for source in calibration.sources}
    title = f"calibration from {costs.source} (what the model charges; ASSUMED: a stated prior, not measured)"
    table = Table(title=title, title_justify="left")
    for name in ("cost", "fwd", "bwd", "source (fwd / bwd)", "fit"):
        table.add_column(name, justify="left" if name in ("cost", "source (fwd / bwd)") else "right")

    def both(cost: str) -> str:
        cells = [_source_cell(sources, cost.format(phase=p)) for p in ("fwd", "bwd")]
        return " / ".join(cells) if cells[0] != cells[1] else cells[0]

    for kind in ("full", "causal", "partial"):
        cells = [number(costs.ms_per_gflop(phase, kind), ".4g") for phase in ("fwd", "bwd")]
        table.add_row(f"compute ms/GFLOP ({kind})", *cells, both("compute.{phase}.efficiency." + kind), "")
    fit = calibration.compute_fit
    residual = ", ".join(f"{p} {100 * v['median_rel_residual']:.1f}%" for p, v in fit.items())
    calls = (number(costs.call_ms.get(p), ".3f") for p in ("fwd", "bwd"))
    table.add_row("kernel call ms", *calls, both("compute.{phase}.call_ms"), f"residual {residual}")
    for buffer in ("double", "sync"):
        for step in ("enter_ms", "pre_ms", "mid_ms", "post_ms"):
            table.add_row(f"host {buffer} {step[:-3]} ms", *(number(costs.host(p, buffer)[step], ".3f")
                                                             for p in ("fwd", "bwd")),
                          both("host.{phase}." + buffer) if step == "enter_ms" else "", "")  # fmt: skip
    for name, link in costs.links.items():
        info = calibration.link_fit.get(name, {})
        table.add_row(f"link {name}: latency us / GB/s", number(link.latency_us, ".1f"),
                      number(link.bandwidth_gbps, ".4g"), _source_cell(sources, f"link.{name}"),
                      f"{info.get('transfers', 0)} transfers")  # fmt: skip
    table.add_row("noise CV compute / link", number(costs.compute_cv, ".3f"), number(costs.link_cv, ".3f"), "", "")
    factors = calibration.rank_factors
    if factors:
        worst = max(factors, key=lambda r: factors[r])
        table.add_row("per-rank compute (max ratio)", f"rank {worst}", number(factors[worst], ".3f"), "",
                      f"{len(factors)} ranks")  # fmt: skip
    return table


def extrapolation_table(assumptions) -> Table:
    """What the calibration measured beside what the prediction asks, and how the model treats the difference."""
    table = Table(title="what the calibration measured, and what this prediction assumes", title_justify="left")
    for name in ("aspect", "calibration measured", "prediction", "how the model prices it"):
        table.add_column(name, justify="left")
    for item in assumptions:
        table.add_row(
            item.aspect, item.measured, item.predicted, ("ASSUMED: " if item.assumed else "") + item.treatment
        )
    return table


def cases_table(cases) -> Table:
    table = Table(title="SIMULATED (a model's prediction, not a measurement)", title_justify="left")
    for name in ("case", "step", "fwd", "bwd", "exposed", "TFLOP/s per rank", "events"):
        table.add_column(name, justify="left" if name == "case" else "right")
    for row in cases:
        strategy = str(row.get("strategy") or "ring")
        extra = "" if strategy in ("ring", "allgather") else f" {strategy}" + (
            f"@{row['placement']}" if row.get("placement") else "")  # fmt: skip
        label = (f"w{row['world']} S={row['seq']} {row['mask']}/{row['layout']}/{row['buffer']}/{row['order']}{extra}"
                 + (f" [{row['faults']}]" if row["faults"] else ""))  # fmt: skip
        per_rank = row["tflops"] / row["world"] if row["world"] else float("nan")  # the record's figure is all ranks'
        table.add_row(label, duration(row["step_ms"]), duration(row["fwd_ms"]), duration(row["bwd_ms"]),
                      f"{number(100 * row['exposed_comm_frac'], '.1f')}%", number(per_rank, ".4g"),
                      row.get("events", ""))  # fmt: skip
    return table


def assumed_lines(calibration) -> list[str]:
    """One line per prior (the costs it stands in for, why, and what run would measure them)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for source in calibration.assumed():
        groups.setdefault((source.how, source.hint), []).append(source.cost)
    return [f"ASSUMED {', '.join(costs)}: {how}" + (f"; to measure it: {hint}" if hint else "")
            for (how, hint), costs in groups.items()]  # fmt: skip


def caveat_line(outcome) -> str | None:
    """One line when any cost of the prediction came from a prior (never a prediction without it)."""
    kernel = outcome.costs.kernel
    if kernel is not None:
        measured = " and what the calibration determined" if outcome.calibration is not None else ""
        return (f"caveat: PRIOR figures of the hardware catalogue for {kernel.gpu}{measured} (the notes above), not "
                "a measurement of this cluster; `ringbench calibrate` there and --from RUN_DIR replace them")  # fmt: skip
    if outcome.calibration is None:
        from ringbench.simulate import DEFAULTS

        given = "the rate given (--compute-tflops) and " if outcome.costs.gflops != DEFAULTS.gflops else ""
        return (f"caveat: no calibration: {given}the documented default costs (400 TFLOP/s, 10 us per kernel call, "
                "5 us host gaps, 100 GB/s links), not a measurement of any machine; `ringbench calibrate` and "
                "--from RUN_DIR price a real one")  # fmt: skip
    assumed = [item.aspect for item in outcome.assumptions if item.assumed]
    if not assumed:
        return None
    return (
        f"caveat: this prediction extrapolates the calibration ({', '.join(dict.fromkeys(assumed))}): the "
        "costs marked ASSUMED are priors, not measurements"
    )


def _hops(ring: dict) -> str:
    hops = ", ".join(f"{label}×{count}" for label, count in sorted(ring["hops"].items()))
    copies = f" (×{ring['copies']})" if ring["copies"] > 1 else ""
    return f"{ring['ring']} {ring['ranks']}{copies}: {hops or 'no hops'}"


def render_plan(plan, out) -> None:
    request = plan.request
    shape = request.mask + (f" docs {request.docs}" if request.docs != "none" else "")
    shape += f", layers {request.layers}" if request.layers != "1" else ""
    hardware = f" on {plan.gpu}" if plan.gpu else ""
    out.print(f"ringbench plan (PREDICTED): {request.world} ranks{hardware} on {plan.topology_text}; S={request.seq:,}, "
              f"{request.heads} heads ({request.key_value_heads} KV) × {request.head_dim}, {request.dtype}, "
              f"{shape}, {request.layout}{'' if request.backward else ', forward only'}")  # fmt: skip
    table = Table(title_justify="left")
    for name, justify in (("#", "right"), ("strategy", "left"), ("placement", "left"), ("step ms", "right"),
                          ("exposed", "right"), ("MiB/rank", "right"), ("traffic MiB/rank", "left"),
                          ("rings", "left")):  # fmt: skip
        table.add_column(name, justify=justify)
    for index, candidate in enumerate(plan.candidates[:12], start=1):
        placement = "-"
        if candidate.placement_name and candidate.placement:
            placement = f"{candidate.placement_name} " + "-".join(map(str, candidate.placement))
        name = candidate.strategy + "".join(f" [{x}]" for x in (candidate.buffer, candidate.layout)
                                            if x in ("double-short", "sync-short", "doc-balanced"))  # fmt: skip
        traffic = ", ".join(f"{label} {number(mib, ',.0f')}" for label, mib in
                            sorted(candidate.mib_by_class.items(), key=lambda item: -item[1]))  # fmt: skip
        table.add_row(str(index), name, placement, number(candidate.step_ms, ",.2f"),
                      f"{number(100 * candidate.exposed_frac, '.0f')}%", number(candidate.memory_mb, ",.1f"),
                      traffic or "-", "; ".join(_hops(r) for r in candidate.rings))  # fmt: skip
    out.print(table)
    if len(plan.candidates) > 12:
        out.print(f"({len(plan.candidates) - 12} more candidates in --json)")
    out.print("Why the others lose:")
    for candidate in [*plan.candidates[1:6], *plan.refused]:
        out.print(f"  {candidate.why}")
    for note in plan.notes:
        out.print(f"note: {note}")
    _render_settings(plan, out)
    if plan.priors:
        out.print(f"Priors (the hardware catalogue's figures for {plan.gpu}; `ringbench plan --list-gpus` cites each "
                  "source; a calibration run on the cluster, --from, replaces what it measures):")  # fmt: skip
        for prior in plan.priors:
            out.print(f"  {prior.cost}: {prior.how}")
    for measured in plan.measured:
        out.print(f"  MEASURED {measured.cost}: {measured.how}")
    out.print(f"Measure the top candidates: {plan.command}")
    out.print(f"Confidence: {plan.confidence}")
    out.print(f"({len(plan.candidates) + len(plan.refused)} candidates in {plan.elapsed_s:.1f} s)")


def _render_settings(plan, out) -> None:
    """How to run the chosen candidate in each framework, and how to launch its ranks."""
    from ringbench.advise.settings import short_text

    if not plan.settings:
        return
    chosen = plan.candidates[plan.settings_for - 1]
    out.print(f"Run #{plan.settings_for} ({chosen.label}) in your framework (--settings-for N for another candidate):")
    for name, entry in plan.settings.items():
        out.print(f"  {short_text(name, entry)}")
        best = entry.get("best")
        if not entry["expresses"] and best is None:
            out.print("    no candidate of this plan runs in it")
        if best is not None:
            out.print(f"    its best expressible candidate: {best['candidate']}, {number(best['step_ms'], ',.2f')} ms "
                      f"(x{number(best['vs_first_choice'] or math.nan, '.2f')} the step): {best['args']}")  # fmt: skip
        launch = entry.get("launch")
        if launch:
            out.print(f"    launch: {_launch_text(launch)}")


def _launch_text(launch: dict, hosts_shown: int = 4) -> str:
    torchrun = launch["torchrun"]
    if torchrun["expresses"]:
        parts = [f"{h['host']}: --node_rank {h['node_rank']} CUDA_VISIBLE_DEVICES={h['CUDA_VISIBLE_DEVICES']}"
                 for h in torchrun["hosts"][:hosts_shown]]  # fmt: skip
        more = f"; ... ({len(torchrun['hosts']) - hosts_shown} more hosts in --json)" if len(torchrun["hosts"]) > \
            hosts_shown else ""  # fmt: skip
        return f"torchrun ({torchrun['env']}) " + "; ".join(parts) + more
    slurm = launch["slurm"]
    hosts = slurm["hostfile"]
    shown = ",".join(hosts[:8]) + (",..." if len(hosts) > 8 else "")
    return (f"{torchrun['reason']}: srun --distribution=arbitrary with {slurm['env']} ({shown}) and per host "
            f"CUDA_VISIBLE_DEVICES " + "; ".join(f"{h}={v}" for h, v in list(slurm["CUDA_VISIBLE_DEVICES"].items())
                                                 [:hosts_shown]))  # fmt: skip


def render_catalogue(out) -> dict:
    """`plan --list-gpus`: every GPU of the catalogue with its figures and their sources, then the citations."""
    from ringbench.hardware import load_catalogue

    catalogue = load_catalogue()
    table = Table(title="The hardware catalogue: PRIOR figures, each followed by its source key in brackets (cited below)",
                  title_justify="left")  # fmt: skip
    for name, justify in (("gpu", "left"), ("NVML names / aliases", "left"), ("dense bf16 TFLOP/s", "right"),
                          ("memory GB/s", "right"), ("links", "left"), ("attention (default first)", "left")):  # fmt: skip
        table.add_column(name, justify=justify)
    rows = []
    for key, gpu in catalogue.gpus.items():
        peak, memory = gpu.peak_tflops("bfloat16"), gpu.figure("memory_gbps")
        links = f"PCIe Gen{int(gpu.value('pcie_gen'))}"
        if gpu.has_nvlink:
            links = (f"NVLink{int(gpu.value('nvlink.generation'))} {int(gpu.value('nvlink.links'))} x "
                     f"{gpu.value('nvlink.gbps_per_link'):g} GB/s [{gpu.figure('nvlink.links').source_key}]; {links}")  # fmt: skip
        rates = gpu.kernel_rates("bfloat16")
        kernels = ", ".join(gpu.kernels) + f" ({rates.rate_tflops('fwd', False, 8192, 128):.0f} fwd TFLOP/s at 8K)"
        table.add_row(key, "; ".join([*gpu.names, *gpu.aliases]), f"{peak.value:g} [{peak.provenance()}]",
                      f"{memory.value:g} [{memory.provenance()}]", links, kernels)  # fmt: skip
        rows.append({"gpu": key, "names": list(gpu.names), "aliases": list(gpu.aliases), "arch": gpu.arch,
                     "figures": {name: {"value": f.value, "source": f.source_key, "derived": f.derived}
                                 for name, f in gpu.figures.items()},
                     "kernels": list(gpu.kernels)})  # fmt: skip
    out.print(table)
    out.print("Attention kernels (fitted to published curves; benchmarks/fit_kernel_rates.py):")
    for family, arches in catalogue.kernels.items():
        for arch, entry in arches.items():
            if isinstance(entry, dict) and ("fwd" in entry or "same_as" in entry):
                out.print(f"  {family} on {arch}: {catalogue.kernel_provenance(family, arch)}")
    out.print("Implementation families (plan --framework): the host's time, the least a phase takes (PRIOR):")
    families = []
    for key, family in catalogue.frameworks.items():
        from ringbench.simulate import describe_framework

        out.print(f"  {key} ({', '.join(family.aliases)}): {family.title}")
        out.print(f"    {describe_framework(family)}")
        families.append({"framework": key, "aliases": list(family.aliases), "title": family.title,
                         "host_call_us": family.host_call_us.value, "host_step_us": family.host_step_us.value,
                         "host_alltoall_us": family.host_alltoall_us.value, "fitted": family.fitted})  # fmt: skip
    out.print("Sources:")
    for key, citation in catalogue.sources.items():
        out.print(f"  [{key}] {citation}")
    return {"gpus": rows, "frameworks": families, "sources": dict(catalogue.sources)}
