"""Scenarios: the sweep a run performs, from a YAML file, CLI flags, or the embedded default.

A scenario gives a list of values per axis (a scalar is a one-element list); the cartesian product is the set of
cases. CLI flags override the file axis by axis. Validation errors name the file, the field, the value and what
is allowed. YAML is loaded with ``yaml.safe_load`` only.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from ringbench.engine.layout import check_divisible
from ringbench.errors import UsageError, bad_value
from ringbench.kernels import KERNEL_HELP, get_kernel
from ringbench.orders import ORDER_HELP, parse_order, parse_placement
from ringbench.scenario.axes import AXIS_NAMES, INT_AXES
from ringbench.scenario.faults import Fault, check_fault_hops, check_faults, parse_fault
from ringbench.scenario.impls import check_impl
from ringbench.scenario.layers import canonical_layers, layer_masks, needs_docs, uses_case_mask
from ringbench.scenario.workload import Case, Workload
from ringbench.vocab import DTYPE_ALIASES, DTYPES, Buffer, Layout, MaskSpec, Strategy

AXES = AXIS_NAMES  # the sweep's axes (ringbench/scenario/axes.py), in the cartesian product's order
SETTINGS = (
    "backward", "iters", "warmup", "check", "timeout", "repeat", "faults", "name", "description", "seed",
    "topology", "emulate_links",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class Scenario:
    """A sweep: value lists per axis plus run settings."""

    name: str = "custom"
    description: str = ""
    world: tuple[int, ...] = (4,)
    """Number of ranks (processes)."""
    seq: tuple[int, ...] = (2048,)
    """Total sequence length S over all ranks."""
    heads: tuple[int, ...] = (4,)
    kv_heads: tuple[int, ...] = (0,)
    """Key/value heads (grouped-query attention: each dividing every value of ``heads``); 0: as many as heads."""
    head_dim: tuple[int, ...] = (32,)
    batch: tuple[int, ...] = (1,)
    dtype: tuple[str, ...] = ("float32",)
    mask: tuple[str, ...] = ("causal",)
    layout: tuple[str, ...] = ("contiguous",)
    buffer: tuple[str, ...] = ("double",)
    order: tuple[str, ...] = ("identity",)
    kernel: tuple[str, ...] = ("torch",)
    impl: tuple[str, ...] = ("ringbench",)
    """Ring-attention implementations (ringbench.rank.impls): ringbench, torch-ring, ..., module:function."""
    strategy: tuple[str, ...] = ("ring",)
    """ring, ulysses, hybrid:U, double-ring:W, allgather (ringbench/engine/strategy.py)."""
    placement: tuple[str, ...] = ("heads-first",)
    """Grouped strategies: heads-first, interleaved, or ranks in placement order (0-2-4-6-1-3-5-7)."""
    docs: tuple[str, ...] = ("none",)
    """Packed documents for the document masks (ringbench.engine.documents): lengths:..., file:PATH, lognormal:...,
    uniform:...; masks without documents ignore the axis."""
    layers: tuple[str, ...] = ("1",)
    """Attention layers per iteration, each with its own mask (ringbench.scenario.layers): 4, or 'window:4096 x5,
    causal x1'."""
    backward: bool = True
    """Time the backward ring too."""
    iters: int = 10
    """Timed iterations per case."""
    warmup: int = 2
    check: bool = True
    """Compare outputs and gradients with the float64 single-device reference."""
    timeout: float = 60.0
    """Seconds any distributed wait may take before the run is declared stalled."""
    repeat: int = 1
    """Fresh process groups per case (run-to-run noise for the CI gate)."""
    faults: tuple[str, ...] = ()
    seed: int = 0
    topology: str | None = None
    """Topology file (nvidia-smi text or YAML) describing the ranks' links: stored with the run for placement."""
    emulate_links: bool = False
    """Realise the topology's link costs as injected transfer delays (an emulated cluster; labelled so)."""
    source: str = field(default="<embedded default>", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", tuple(DTYPE_ALIASES.get(str(d), d) for d in self.dtype))
        # Canonical masks and layers (causal+window:64 -> window:64): case ids and the record compare them as
        # strings. Malformed values are left for validate() to name.
        for name, canon in (("mask", lambda v: MaskSpec.parse(v).text), ("layers", canonical_layers),
                            ("docs", lambda v: str(v).strip())):  # fmt: skip
            values = []
            for value in getattr(self, name):
                try:
                    values.append(canon(value))
                except (UsageError, TypeError, ValueError):
                    values.append(value)
            object.__setattr__(self, name, tuple(values))
        # One canonical spelling of each fault everywhere (slow-rank:3:1.50 -> slow-rank:3:1.5): the record, the
        # verdicts and the gate compare specs as strings. A malformed spec is left for validate() to name.
        canonical = []
        for spec in self.faults:
            try:
                canonical.append(parse_fault(spec).spec)
            except (UsageError, TypeError):
                canonical.append(spec)
        object.__setattr__(self, "faults", tuple(canonical))

    def cases(self) -> list[Case]:
        """The cartesian product of the axes, less what does not make a case: a mask without documents runs with
        docs ``none`` (the axis does not change it), a document mask needs documents, doc-balanced needs a
        document mask, and a layers pattern that names every layer's mask makes the mask axis irrelevant."""
        combos = itertools.product(*(getattr(self, axis) for axis in AXES))
        cases, seen = [], set()
        for values in combos:
            axes = dict(zip(AXES, values, strict=True))
            if not uses_case_mask(axes["layers"]):
                axes["mask"] = self.mask[0]
            masks = layer_masks(axes["layers"], axes["mask"])
            documented = any(needs_docs(m) for m in masks)
            if not documented:
                axes["docs"] = "none"
            elif axes["docs"] == "none":
                continue
            if axes["layout"] == Layout.DOC_BALANCED.value and not all(needs_docs(m) for m in masks):
                continue
            case = Case.from_axes(**axes, backward=self.backward)
            if case.case_id not in seen:
                seen.add(case.case_id)
                cases.append(case)
        return cases

    def validate(self) -> Scenario:
        """Check every axis and setting, in a fixed order; the first error names the file, the field, the value
        and what is allowed."""
        where = f"{self.source}: " if self.source != "<embedded default>" else ""
        self._validate_axes(where)
        self._validate_kernels(where)
        self._validate_strategies(where)
        self._validate_impls(where)
        self._validate_settings(where)
        self._validate_rings(where, self._parsed_faults(where))
        self._validate_topology(where)
        return self

    def _validate_axes(self, where: str) -> None:
        """The integer axes, the dtypes, each mask, layout and buffer, and the masks' layers and documents."""
        for axis in INT_AXES:
            low = 0 if axis == "kv_heads" else 1  # 0: as many as heads
            for value in getattr(self, axis):
                if not isinstance(value, int) or isinstance(value, bool) or value < low:
                    raise _failure(where, axis, value, f"an integer >= {low}")
        for heads, kv_heads in itertools.product(self.heads, self.kv_heads):
            if kv_heads and heads % kv_heads:
                raise _failure(where, "kv_heads", kv_heads, f"an integer dividing heads={heads}, or 0 (as many)")
        for value in self.dtype:
            if value not in DTYPES:
                raise _failure(where, "dtype", value, "one of: " + ", ".join([*DTYPES, *DTYPE_ALIASES]))
        for axis, choice in (("mask", MaskSpec), ("layout", Layout), ("buffer", Buffer)):
            for value in getattr(self, axis):
                try:
                    choice.parse(value, axis)
                except UsageError as exc:
                    raise UsageError(where + str(exc)) from None
        self._validate_masks(where)

    def _validate_masks(self, where: str) -> None:
        """The layers, the documents and the layouts that need them: each bad value named in one line."""
        from ringbench.engine.documents import check_docs

        fail = functools.partial(_failure, where)

        patterns = []
        for value in self.layers:
            try:
                patterns.append(layer_masks(value, "mask"))
            except UsageError as exc:
                raise UsageError(where + str(exc)) from None
        masks = {m if m != "mask" else case_mask for p in patterns for m in p for case_mask in self.mask}
        documented = sorted(m for m in masks if needs_docs(m))
        real_docs = [d for d in self.docs if d != "none"]
        for spec in self.docs:
            if not isinstance(spec, str):
                raise fail("docs", spec, "a docs spec: none, lengths:..., file:PATH, lognormal:... or uniform:...")
            for seq in self.seq:
                try:
                    check_docs(spec, seq)
                except UsageError as exc:
                    raise UsageError(where + str(exc) + (f" (seq={seq})" if len(self.seq) > 1 else "")) from None
        if documented and not real_docs:
            raise fail(
                "mask",
                documented[0],
                "a mask without documents, or documents given with docs (--docs): "
                "lengths:L1,L2,..., file:PATH, lognormal:MEAN:SIGMA:SEED or uniform:MIN:MAX:SEED",
            )
        if Layout.DOC_BALANCED.value in self.layout and not documented:
            shown = ", ".join(sorted(masks)) or "causal"
            raise fail(
                "layout",
                "doc-balanced",
                f"a layout other than doc-balanced with mask {shown}: doc-balanced "
                "balances packed documents (masks causal-document, full-document, causal-document+window:W)",
            )
        if self.cases() == [] and self.world:
            raise fail("mask", ", ".join(self.mask), "masks, docs and layouts that make at least one case")

    def _validate_kernels(self, where: str) -> None:
        """Each kernel is known, and one that computes nothing is not checked."""
        for value in self.kernel:
            try:
                kernel = get_kernel(value)
            except UsageError:
                raise _failure(where, "kernel", value, KERNEL_HELP) from None
            if self.check and not getattr(kernel, "computes", True):
                allowed = f"false with kernel {value!r}: it computes nothing to check (--no-check)"
                raise _failure(where, "check", True, allowed)

    def _validate_impls(self, where: str) -> None:
        for value in self.impl:
            try:
                check_impl(value)
            except UsageError as exc:
                raise UsageError(where + str(exc)) from None

    def _validate_settings(self, where: str) -> None:
        """The scalar settings: counts, the timeout, the switches, the texts, the topology path and the seed."""
        for number, name, low in ((self.iters, "iters", 1), (self.warmup, "warmup", 0), (self.repeat, "repeat", 1)):
            if not isinstance(number, int) or isinstance(number, bool) or number < low:
                raise _failure(where, name, number, f"an integer >= {low}")
        if not isinstance(self.timeout, (int, float)) or isinstance(self.timeout, bool):
            raise _failure(where, "timeout", self.timeout, "a number of seconds > 0")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise _failure(where, "timeout", self.timeout, "a finite number of seconds > 0")
        for name in ("backward", "check", "emulate_links"):
            if not isinstance(getattr(self, name), bool):
                raise _failure(where, name, getattr(self, name), "true or false")
        for name in ("name", "description"):
            if not isinstance(getattr(self, name), str):
                raise _failure(where, name, getattr(self, name), "a string")
        if self.topology is not None and not isinstance(self.topology, str):
            raise _failure(where, "topology", self.topology, "a file path")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise _failure(where, "seed", self.seed, "an integer")

    def _parsed_faults(self, where: str) -> list[Fault]:
        parsed = []
        for spec in self.faults:
            try:
                parsed.append(parse_fault(spec))
            except UsageError as exc:
                raise UsageError(where + str(exc)) from None
        return parsed

    def _validate_rings(self, where: str, faults: list[Fault]) -> None:
        """Per world: each order makes a ring, each layout divides each sequence, and each fault can act on the
        ring each order and buffer make; with buffer allgather a crash or hang comes at step 0."""
        for world in self.world:
            for order in self.order:
                try:
                    parse_order(order, world)
                except UsageError as exc:
                    raise UsageError(where + str(exc) + f" (world={world})") from None
            for seq, layout in itertools.product(self.seq, self.layout):
                try:
                    check_divisible(layout, seq, world)
                except UsageError as exc:
                    raise UsageError(where + str(exc)) from None
            try:
                check_faults(faults, world)
                # Per case (the order and the buffer are sweep axes), before anything runs: a fault that cannot act
                # is refused with the hops the ring uses.
                for order, buffer in itertools.product(self.order, self.buffer):
                    check_fault_hops(faults, parse_order(order, world), order, buffer=buffer)
            except UsageError as exc:
                raise UsageError(where + str(exc)) from None
        if "allgather" in self.buffer:
            for fault in faults:
                if fault.kind in ("crash", "hang") and fault.step > 0:
                    allowed = "step 0 with buffer allgather (it has no later ring steps)"
                    raise _failure(where, "fault", fault.spec, allowed)

    def _validate_topology(self, where: str) -> None:
        """Emulated links need a topology, and the topology has a device per rank of every world."""
        if self.emulate_links and not self.topology:
            raise _failure(where, "emulate_links", True, "only together with topology: FILE")
        if self.topology:
            topology = self.load_topology()
            for world in self.world:
                if world != topology.world:
                    allowed = f"{topology.world}, the number of devices in topology {self.topology}"
                    raise _failure(where, "world", world, allowed)

    def _validate_strategies(self, where: str) -> None:
        """Each strategy parses, its degrees divide every world and its Ulysses degree the heads, each placement is
        a permutation cut into whole groups; strategies other than the ring run on ringbench's own engine."""
        strategies = []
        for value in self.strategy:
            try:
                strategies.append(Strategy.parse(value))
            except UsageError as exc:
                raise UsageError(where + str(exc)) from None
        for strategy in strategies:
            if strategy.kind == "ring":
                continue
            others = [impl for impl in self.impl if impl != "ringbench"]
            if others:
                raise UsageError(where + f"strategy={strategy.spec!r} is not allowed with impl={others[0]!r}; "
                                 "strategies other than the ring run on ringbench's own engine")  # fmt: skip
            for world, heads, kv_heads in itertools.product(self.world, self.heads, self.kv_heads):
                try:
                    strategy.check(world, heads, kv_heads=kv_heads)
                except UsageError as exc:  # the message names the world (or the heads) itself
                    raise UsageError(where + str(exc)) from None
            if strategy.grouped:
                for world, placement in itertools.product(self.world, self.placement):
                    try:
                        parse_placement(placement, world, strategy.group_size(world))
                    except UsageError as exc:
                        raise UsageError(where + str(exc) + f" (world={world})") from None

    def load_topology(self):
        """The topology named by ``topology`` (relative paths are taken from the scenario file's folder)."""
        from ringbench.topology import load_topology

        path = Path(self.topology)
        if not path.is_absolute() and not path.exists() and self.source not in ("<embedded default>", ""):
            candidate = Path(self.source).parent / path
            shipped = resources.files("ringbench.scenarios") / self.topology  # beside a shipped scenario
            if candidate.exists():
                path = candidate
            elif Path(self.source).name == self.source and shipped.is_file():
                with resources.as_file(shipped) as found:
                    return load_topology(found)
        return load_topology(path)

    def link_model(self) -> dict | None:
        """Per-pair (latency_us, bandwidth_gbps) for emulated links, whether the pair crosses hosts, and each
        rank's host and NIC (ringbench.topology.linkmodel prices a transfer from them), or None."""
        if not self.emulate_links:
            return None
        topology = self.load_topology()
        world = topology.world
        host = topology.host_ids()
        latency = [[0.0] * world for _ in range(world)]
        bandwidth = [[1e12] * world for _ in range(world)]
        for src in range(world):
            for dst in range(world):
                if src != dst:
                    link = topology.link(src, dst)
                    latency[src][dst], bandwidth[src][dst] = topology.cost_model.latency_bandwidth(link)
        net = [[bool(host[src] != host[dst]) for dst in range(world)] for src in range(world)]
        hosts = [device.host for device in topology.devices]
        return {"latency_us": latency, "bandwidth_gbps": bandwidth, "net": net, "hosts": hosts,
                "nics": [int(nic) for nic in topology.nic_ids()]}  # fmt: skip

    def with_overrides(self, **overrides) -> Scenario:
        """CLI flags override the file: empty lists and None mean 'not given'."""
        changes = {}
        for key, value in overrides.items():
            if value is None or (isinstance(value, (list, tuple)) and not value):
                continue
            changes[key] = tuple(value) if isinstance(value, (list, tuple)) else value
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.pop("source")
        return {key: list(value) if isinstance(value, tuple) else value for key, value in data.items()}


def _failure(where: str, name: str, value: object, allowed: str) -> UsageError:
    """The error of a bad ``name`` (``where``: the scenario file, or "" for the embedded default)."""
    return UsageError(where + str(bad_value(name, value, allowed)))


# The embedded default: what `ringbench run` (and `make run`) does with no argument.
DEFAULT_SCENARIO = Scenario(
    name="default",
    description=(
        "4 local ranks; causal attention, contiguous vs zigzag layout, sync vs double buffering, "
        "real compute and emulated compute (so overlap shows on CPU), forward and backward, checked "
        "against float64 single-device attention."
    ),
    world=(4,),
    seq=(1024,),
    heads=(2,),
    head_dim=(32,),
    mask=("causal",),
    layout=("contiguous", "zigzag"),
    buffer=("sync", "double"),
    kernel=("torch", "emulated:auto"),
    iters=6,
    warmup=2,
)


def _as_tuple(path: str, name: str, value) -> tuple:
    if isinstance(value, (list, tuple)):
        if not value:
            raise UsageError(f"{path}: {name}=[] is not allowed; expected at least one value")
        return tuple(value)
    return (value,)


def shipped_scenarios() -> list[str]:
    """The names of the scenarios installed with ringbench (scenarios/*.yaml)."""
    folder = resources.files("ringbench.scenarios")
    return sorted(item.name.removesuffix(".yaml") for item in folder.iterdir() if item.name.endswith(".yaml"))


def load_scenario(path: str | Path) -> Scenario:
    """A scenario file by path, or by name from the shipped scenarios (``default``, ``masks``, ...)."""
    path_str = str(path)
    file = Path(path_str)
    if not file.exists() and not path_str.endswith((".yaml", ".yml")):
        shipped = resources.files("ringbench.scenarios") / f"{path_str}.yaml"
        if shipped.is_file():
            return _parse(shipped.read_text(), f"{path_str}.yaml")
    try:
        text = file.read_text()
    except FileNotFoundError:
        names = shipped_scenarios()
        stem = Path(path_str).stem
        hint = f" (`ringbench run {stem}` runs the shipped one)" if stem in names else ""
        raise UsageError(
            f"scenario={path_str!r} is not allowed: no such file; expected a YAML file or a shipped scenario name: "
            f"{', '.join(names)}{hint}"
        ) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise UsageError(f"scenario={path_str!r} is not readable ({type(exc).__name__})") from None
    return _parse(text, path_str)


def _parse(text: str, source: str) -> Scenario:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{source}: not valid YAML{where}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping of fields (axes and settings), got {type(data).__name__}")
    known = set(AXES) | set(SETTINGS)
    values = {}
    for key, value in data.items():
        if key not in known:
            raise UsageError(f"{source}: field {key!r} is not allowed; expected one of: {', '.join(sorted(known))}")
        if key in AXES or key == "faults":
            values[key] = _as_tuple(source, key, value) if key != "faults" or value else ()
        else:
            values[key] = value
    for key in (
        "order",
        "kernel",
        "dtype",
        "mask",
        "layout",
        "buffer",
        "impl",
        "strategy",
        "placement",
        "faults",
        "docs",
        "layers",
    ):
        if key in values:
            if key == "layers" and any(isinstance(v, bool) or not isinstance(v, (str, int)) for v in values[key]):
                bad = next(v for v in values[key] if isinstance(v, bool) or not isinstance(v, (str, int)))
                raise UsageError(f"{source}: " + str(bad_value("layers", bad, "a count or a pattern of masks")))
            values[key] = tuple(str(v) for v in values[key])
    return Scenario(**values, source=source).validate()


__all__ = ["AXES", "DEFAULT_SCENARIO", "ORDER_HELP", "Case", "Scenario", "Workload", "load_scenario"]
