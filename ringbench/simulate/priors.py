"""The simulator's costs for a GPU of the hardware catalogue: every figure a PRIOR, each with its source.

    prior = gpu_prior(find_gpu("a100-sxm"), "bfloat16")       # GpuPrior: costs, link class costs, sources
    topology = prior.price_links(topology)                    # the topology priced as NCCL moves data on it
    costs, sources = prior.with_calibration(calibration)      # what a run on the cluster measured replaces priors

Compute: the attention kernel's model (hardware/kernel.py) prices every call from its shape. Beside it, each cost
a real ring pays is its own term (simulate/costs.py): the merge of every block into the online-softmax
accumulator (bytes per output element over the memory's bandwidth), the ring step's launch and stream gaps (the
host steps' ``pre_ms``), an all-to-all's layout copies and fixed gap, and the imperfect overlap of a transfer with
the kernel beside it. Links, per `nvidia-smi topo -m` class: NVLink at NCCL's point-to-point share of the line
rate (its all-to-all share for all-to-alls), PCIe switches at the generation's x16 rate, paths through the CPU
at half of it (staged through host memory) and all-to-alls through the CPU at NCCL's measured collapse, the
network at one NIC per GPU. A topology file's own class costs and measured links win over these.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ringbench.errors import UsageError
from ringbench.hardware import Gpu
from ringbench.simulate.costs import HOST_STEPS, PHASES, Costs, CostSource, LinkCost

HOST_BRIDGE = ("PHB", "NODE", "SYS")


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuPrior:
    """A GPU's prior costs: the simulator's Costs, the topology's class costs, and where every figure came from."""

    gpu: Gpu
    dtype: str
    costs: Costs
    class_costs: dict[str, dict[str, float]]
    """Per link class (NV per link): latency_us, bandwidth_gbps, alltoall_gbps (topology CostModel overrides)."""
    sources: list[CostSource] = field(default_factory=list)

    def price_links(self, topology):
        """``topology`` with this GPU's link classes, what the file states of them and its measured links kept (a
        figure the file leaves out -- a NET latency beside its bandwidth -- is this GPU's cited prior, not the
        topology's nominal default)."""
        from ringbench.topology.cost import CostModel

        own = topology.cost_model
        model = CostModel(message_bytes=own.message_bytes).with_overrides(self.class_costs)
        return replace(topology, cost_model=model.with_overrides(own.stated()))

    def for_topology(self, topology) -> GpuPrior:
        """This prior with its link lines saying what pricing ``topology`` uses: a class figure the topology file
        states is GIVEN (with its value), the rest stay PRIOR (with their sources)."""
        stated = topology.cost_model.stated()
        if not stated:
            return self
        priced = self.price_links(topology).cost_model
        kept = [source for source in self.sources if not source.cost.startswith("link.")]
        return replace(self, sources=kept + _link_sources(self.gpu, stated, priced))

    def with_calibration(self, calibration, family: str = "real") -> tuple[Costs, list[CostSource]]:
        """The priors with what ``calibration`` (a run on the cluster) determined in their place.

        Compute: the run's fitted rates when it measured real kernels (its block shapes), else the kernel prior.
        Links: the classes the run measured. Host gaps and the strategies' own times: where the run fitted them.
        """
        if calibration is None:
            return self.costs, list(self.sources)
        measured = calibration.costs_for(family)
        determined = {source.cost for source in calibration.sources if source.determined}
        costs, sources = self.costs, list(self.sources)
        if measured is not None and any(name.startswith("compute.") for name in determined) and family == "real":
            costs = replace(costs, kernel=None, gflops=measured.gflops, efficiency=measured.efficiency,
                            call_ms=measured.call_ms)  # fmt: skip
            sources = [s for s in sources if not s.cost.startswith("compute.")]
        links = {name: cost for name, cost in (measured or calibration.costs).links.items() if name != "local"}
        if links:
            costs = replace(costs, links={**costs.links, **links})
            sources = [s for s in sources if s.cost.removeprefix("link.") not in links]
        if any(name.startswith("host.") for name in determined):  # the run's own host times, the framework's too
            costs = replace(costs, host_ms=(measured or calibration.costs).host_ms, host_floor_ms={})
            sources = [s for s in sources if not s.cost.startswith("host.")]
        fitted = (measured or calibration.costs).strategy_ms
        if fitted:
            costs = replace(costs, strategy_ms={**costs.strategy_ms, **fitted})
        source = str((measured or calibration.costs).source)
        return replace(costs, source=f"{source} + prior:{self.gpu.key}"), sources


def _prior(cost: str, how: str, hint: str = "") -> CostSource:
    return CostSource(cost=cost, determined=False, how=f"PRIOR {how}", hint=hint)


def gpu_prior(gpu: Gpu, dtype: str, attention: str | None = None, framework: object = "ringbench") -> GpuPrior:
    """The prior costs of ``gpu`` running ``attention`` (a kernel family; None: its default) in ``dtype``, with the
    host times of ``framework`` (an implementation family of the catalogue, or its key)."""
    from ringbench.hardware import Framework, load_catalogue

    catalogue = load_catalogue()
    family = framework if isinstance(framework, Framework) else catalogue.framework(str(framework))
    rates = gpu.kernel_rates(dtype, attention)
    overhead = catalogue.overhead
    memory = gpu.figure("memory_gbps")
    stream_gbps = memory.value * overhead("memory_efficiency").value  # elementwise kernels' bandwidth
    merge_bytes = overhead("merge_bytes_per_element").value
    merge_ms_per_melem = merge_bytes * 1e6 / (stream_gbps * 1e9) * 1e3
    transpose_ms_per_mib = 2 * overhead("transpose_bytes_per_element").value / 2 * 2**20 / (stream_gbps * 1e9) * 1e3
    step_gap, a2a_gap = overhead("step_gap_us"), overhead("alltoall_gap_us")
    penalty = overhead("overlap_penalty")
    call_ms = rates.call_us / 1e3
    host = {phase: {buffer: dict.fromkeys(HOST_STEPS, 0.0) | {"pre_ms": step_gap.value / 1e3}
                    for buffer in ("sync", "double")} for phase in PHASES}  # fmt: skip
    costs = Costs(gflops=gpu.peak_tflops(dtype).value * 1e3, call_ms=dict.fromkeys(PHASES, call_ms), host_ms=host,
                  kernel=rates, merge_ms_per_melem=merge_ms_per_melem, transpose_ms_per_mib=transpose_ms_per_mib,
                  overlap_penalty=penalty.value, strategy_ms={"ulysses": a2a_gap.value / 1e3,
                  "hybrid": a2a_gap.value / 1e3}, links={"local": LinkCost(latency_us=5.0, bandwidth_gbps=100.0)},
                  gap_ms=0.0, host_floor_ms=host_floor(family), source=f"prior:{gpu.key}")  # fmt: skip
    hint = "calibrate on this cluster (ringbench calibrate, then --from) to measure it"
    sources = [
        _prior("compute.attention", f"{rates.describe()}; {catalogue.kernel_provenance(rates.kernel, gpu.arch)}", hint),
        _prior("compute.call_ms", f"{rates.call_us:g} us per kernel call", hint),
        _prior(
            "compute.merge",
            f"{merge_ms_per_melem * 1e3:.1f} us per million output elements merged "
            f"({merge_bytes:g} bytes per element at {stream_gbps:,.0f} GB/s: {memory.value:,.0f} GB/s "
            f"[{memory.provenance()}] x {overhead('memory_efficiency').value:g})",
            hint,
        ),
        _prior("host.step_gap", f"{step_gap.value:g} us per ring step on the device ({step_gap.provenance()})", hint),
        _prior(
            "strategy.alltoall",
            f"{a2a_gap.value:g} us per all-to-all on the device ({a2a_gap.provenance()}) and "
            f"{transpose_ms_per_mib * 1e3:.2f} us per MiB of layout copies",
            hint,
        ),
        _prior("host.framework", describe_framework(family), hint),
        _prior(
            "overlap_penalty",
            f"{penalty.value:g} of a transfer's time slows the kernel beside it ({penalty.provenance()})",
            hint,
        ),
    ]
    class_costs, link_sources = _link_classes(gpu)
    return GpuPrior(gpu=gpu, dtype=dtype, costs=costs, class_costs=class_costs, sources=sources + link_sources)


def host_floor(family) -> dict[str, float]:
    """An implementation family's host times (ms) as the costs carry them (simulate/host_floor.py)."""
    return {"call": family.host_call_us.value / 1e3, "step": family.host_step_us.value / 1e3,
            "alltoall": family.host_alltoall_us.value / 1e3}  # fmt: skip


def describe_framework(family) -> str:
    """One line: the family's host times, their provenance, and what they were fitted on."""
    fitted = f"; fitted on {family.fitted}" if family.fitted else ""
    return (f"framework {family.key}: the host's time per attention call {family.host_call_us.value:g} us + "
            f"{family.host_step_us.value:g} us per ring step + {family.host_alltoall_us.value:g} us per all-to-all "
            f"is the least a phase takes ({family.host_step_us.provenance()}{fitted})")  # fmt: skip


def framework_costs(costs: Costs, framework) -> Costs:
    """``costs`` (the documented defaults or a calibration's) with an implementation family's host times."""
    return replace(costs, host_floor_ms=host_floor(framework))


def _link_classes(gpu: Gpu) -> tuple[dict[str, dict[str, float]], list[CostSource]]:
    """Per topology class: point-to-point latency and bandwidth, and the all-to-all bandwidth per device."""
    from ringbench.hardware import load_catalogue

    links = load_catalogue().links
    nv, pcie, net = links["nvlink"], links["pcie"], links["net"]
    out: dict[str, dict[str, float]] = {}
    if gpu.has_nvlink:
        per_link = gpu.value("nvlink.gbps_per_link")
        out["NV"] = {"latency_us": nv["latency_us"].value, "bandwidth_gbps": per_link * nv["p2p_efficiency"].value,
                     "alltoall_gbps": per_link * nv["alltoall_efficiency"].value}  # fmt: skip
    x16 = pcie["x16_gen5_gbps" if int(gpu.value("pcie_gen")) >= 5 else "x16_gen4_gbps"].value
    switch = {"latency_us": pcie["latency_us"].value, "bandwidth_gbps": x16, "alltoall_gbps": x16}
    bridge = {"latency_us": pcie["host_bridge_latency_us"].value,
              "bandwidth_gbps": x16 * pcie["host_bridge_efficiency"].value,
              "alltoall_gbps": pcie["alltoall_host_bridge_gbps"].value}  # fmt: skip
    out.update({"PIX": switch, "PXB": switch} | dict.fromkeys(HOST_BRIDGE, bridge))
    # NET: one NIC's bandwidth, in every exchange (an all-to-all across hosts runs at the NIC's rate, shared by
    # the flows through it; the topology says which GPUs share a NIC)
    out["NET"] = {"latency_us": net["latency_us"].value, "bandwidth_gbps": net["nic_gbps"].value}
    return out, _link_sources(gpu, {}, None)


def _link_sources(gpu: Gpu, stated: dict[str, dict[str, float]], priced) -> list[CostSource]:
    """One line per link class group as the plan prices it: PRIOR lines (with their sources) for the classes the
    topology does not state, a GIVEN line per class it states (what is priced, and which of its figures stay
    PRIOR). ``priced``: the priced CostModel (None when nothing is stated)."""
    from ringbench.hardware import load_catalogue

    links = load_catalogue().links
    nv, pcie, net = links["nvlink"], links["pcie"], links["net"]
    sources = []
    if gpu.has_nvlink and "NV" not in stated:
        per_link = gpu.value("nvlink.gbps_per_link")
        sources.append(_prior("link.NV", f"{per_link * nv['p2p_efficiency'].value:.1f} GB/s per NVLink point to "
                              f"point ({per_link:g} GB/s line rate [{gpu.figure('nvlink.gbps_per_link').provenance()}]"
                              f" x {nv['p2p_efficiency'].value:g} [{nv['p2p_efficiency'].provenance()}]), "
                              f"{per_link * nv['alltoall_efficiency'].value:.1f} in an all-to-all (x "
                              f"{nv['alltoall_efficiency'].value:g} [{nv['alltoall_efficiency'].provenance()}]), "
                              f"{nv['latency_us'].value:g} us"))  # fmt: skip
    generation = int(gpu.value("pcie_gen"))
    x16_figure = pcie["x16_gen5_gbps" if generation >= 5 else "x16_gen4_gbps"]
    parts = []
    switch = [name for name in ("PIX", "PXB") if name not in stated]
    if switch:
        parts.append(f"PCIe Gen{generation} x16 {x16_figure.value:g} GB/s under a switch ({', '.join(switch)}; "
                     f"{x16_figure.provenance()})")  # fmt: skip
    bridge = [name for name in HOST_BRIDGE if name not in stated]
    if bridge:
        parts.append(f"through the CPU ({', '.join(bridge)}) "
                     f"{x16_figure.value * pcie['host_bridge_efficiency'].value:g} GB/s point to point, "
                     f"{pcie['host_bridge_latency_us'].value:g} us [{pcie['host_bridge_latency_us'].provenance()}], "
                     f"and {pcie['alltoall_host_bridge_gbps'].value:g} GB/s per GPU in an all-to-all "
                     f"[{pcie['alltoall_host_bridge_gbps'].provenance()}]")  # fmt: skip
    if parts:
        sources.append(_prior("link.PCIe", "; ".join(parts)))
    if "NET" not in stated:
        sources.append(_prior("link.NET", f"{net['nic_gbps'].value:g} GB/s per NIC, {net['latency_us'].value:g} us "
                              f"[{net['nic_gbps'].provenance()}] (a topology file's NET class costs win)"))  # fmt: skip
    for name, row in stated.items():
        sources.append(_given(name, row, priced))
    return sources


def _given(name: str, row: dict[str, float], priced) -> CostSource:
    """A class the topology states: every figure priced, each marked GIVEN (stated by the file) or PRIOR."""
    from ringbench.topology.links import LinkKind

    cost = priced.class_costs[LinkKind(name)]
    bandwidth = f"{cost.bandwidth_gbps:.4g} GB/s"
    bandwidth += {"NET": f" ({cost.bandwidth_gbps * 8:.4g} Gb/s) per NIC", "NV": " per NVLink"}.get(name, "")
    figures = {"bandwidth_gbps": f"{bandwidth} point to point", "latency_us": f"{cost.latency_us:.4g} us latency"}
    if cost.alltoall_gbps is not None:
        ratio = "" if "alltoall_gbps" in row else " (the prior's ratio to the point-to-point bandwidth)"
        figures["alltoall_gbps"] = f"{cost.alltoall_gbps:.4g} GB/s per device in an all-to-all{ratio}"
    given = [text for key, text in figures.items() if key in row]
    kept = [text for key, text in figures.items() if key not in row]
    how = "GIVEN by the topology file: " + ", ".join(given)
    if kept:
        how += "; PRIOR (this GPU's class figures): " + ", ".join(kept)
    return CostSource(cost=f"link.{name}", determined=False, how=how, given=True)


def detected_gpus() -> list[str]:
    """Product names of the GPUs NVML sees on this machine ([] without NVML or GPUs)."""
    from ringbench.topology.nvml import local_gpu_names

    return local_gpu_names()


def find_hardware(name: str | None, *, detect: bool = True, found: list[str] | None = None) -> Gpu | None:
    """The catalogue GPU to price for: ``name`` (key, alias or NVML name), else what NVML finds here, else None.

    ``found``: the product names NVML reports (None: ask NVML when ``detect``). A ``name`` that contradicts them
    is refused -- what this machine has wins -- unless detection is off (pricing another cluster from here).
    """
    from ringbench.hardware import find_gpu

    named = find_gpu(name) if name else None
    if found is None:
        found = detected_gpus() if detect else []
    found_keys = []
    for product in dict.fromkeys(found):
        try:
            found_keys.append(find_gpu(product).key)
        except UsageError:
            if named is None:
                raise UsageError(f"gpu: NVML found {product!r}, which the hardware catalogue does not have; pass "
                                 "--gpu with the closest one (ringbench plan --list-gpus)") from None  # fmt: skip
            found_keys.append(product)
    if named is not None and any(key != named.key for key in found_keys):
        raise UsageError(f"gpu={name!r} contradicts the GPUs NVML found on this machine "
                         f"({', '.join(dict.fromkeys(found))}): the GPUs found win; drop --gpu, or add --no-detect "
                         "to price other hardware from here")  # fmt: skip
    if named is not None:
        return named
    if len(set(found_keys)) > 1:
        raise UsageError("gpu: NVML found different GPUs on this machine (" + ", ".join(dict.fromkeys(found)) +
                         "); pass --gpu with the one to price for")  # fmt: skip
    return find_gpu(found_keys[0]) if found_keys else None


__all__ = ["GpuPrior", "describe_framework", "detected_gpus", "find_hardware", "framework_costs", "gpu_prior",
           "host_floor"]  # fmt: skip
