"""The hardware catalogue (catalogue.yaml): GPUs by NVML name or alias, their attention kernels, links, overheads.

    gpu = find_gpu("NVIDIA A100-SXM4-80GB")      # or "a100-sxm", "a100"; unknown: UsageError listing the names
    rates = gpu.kernel_rates("bfloat16")         # KernelRates of the GPU's default attention kernel (kernel.py)
    gpu.figure("memory_gbps")                    # Figure(value, source, derived)

Every figure carries its source (a key of the file's ``sources``, resolved to its citation) and, where it is not a
published value, how it was derived: what `plan --list-gpus` prints and what a plan marks PRIOR.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from ringbench.errors import UsageError, bad_value
from ringbench.hardware.kernel import EXP_PER_SM_CLOCK, KernelRates, PassModel

ATTENTION_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True, kw_only=True, slots=True)
class Figure:
    """One catalogue figure: its value, its source's citation, and how it was derived (empty: published as is)."""

    value: float
    source: str = ""
    """The citation (the catalogue's ``sources`` entry)."""
    source_key: str = ""
    """Its short key (what terminal lines print; `plan --list-gpus` lists the citations)."""
    derived: str = ""

    def provenance(self) -> str:
        """``source-key; derived: ...`` (short, for one line)."""
        return "; ".join(part for part in (self.source_key, f"derived: {self.derived}" if self.derived else "")
                         if part)  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class Gpu:
    """One GPU of the catalogue."""

    key: str
    names: tuple[str, ...]
    aliases: tuple[str, ...]
    arch: str
    figures: Mapping[str, Figure]
    """sms, boost_ghz, memory_gbps, pcie_gen, dense_tflops.<dtype>, nvlink.* (gbps_per_link, links, generation)."""
    kernels: tuple[str, ...]
    """Attention kernel families, the default first."""
    catalogue: Catalogue = field(repr=False, compare=False)

    def figure(self, name: str) -> Figure:
        return self.figures[name]

    def value(self, name: str, default: float | None = None) -> float | None:
        found = self.figures.get(name)
        return found.value if found is not None else default

    @property
    def has_nvlink(self) -> bool:
        return "nvlink.links" in self.figures

    def peak_tflops(self, dtype: str) -> Figure:
        found = self.figures.get(f"dense_tflops.{dtype}")
        if found is None:
            have = sorted(name.split(".", 1)[1] for name in self.figures if name.startswith("dense_tflops."))
            raise bad_value("dtype", dtype, f"one the catalogue has a dense peak for on {self.key}: " + ", ".join(have))
        return found

    def kernel_rates(self, dtype: str, kernel: str | None = None) -> KernelRates:
        """The attention kernel's rate model on this GPU in ``dtype`` (``kernel``: a family; None: the default)."""
        family = kernel or self.kernels[0]
        if family not in self.kernels:
            raise bad_value("attention", family, f"one of the kernels the catalogue has for {self.key}: "
                            + ", ".join(self.kernels))  # fmt: skip
        if dtype not in ATTENTION_DTYPES:
            raise bad_value("dtype", dtype, f"one the catalogue has an attention rate for on {self.key} ("
                            f"{self.catalogue.kernel_title(family)}): " + ", ".join(ATTENTION_DTYPES))  # fmt: skip
        peak = self.peak_tflops(dtype).value
        fwd, bwd, call_us = self.catalogue.kernel_params(family, self.arch)
        exp_tera = EXP_PER_SM_CLOCK * self.value("sms") * self.value("boost_ghz") * 1e9 / 1e12
        return KernelRates(kernel=family, gpu=self.key, dtype=dtype, peak_tflops=peak, exp_tera=exp_tera,
                           sms=int(self.value("sms")), fwd=fwd, bwd=bwd, call_us=call_us)  # fmt: skip

    def describe(self) -> str:
        return f"{self.key} ({self.names[0]})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Framework:
    """One implementation family: the host's time for its attention call, each ring step and each all-to-all
    (a phase takes at least their sum: ringbench/simulate/host_floor.py)."""

    key: str
    title: str
    aliases: tuple[str, ...]
    host_call_us: Figure
    """Host time of one attention call (its entry, the layout's checks and dispatch)."""
    host_step_us: Figure
    """Host time of one ring step (launches, P2P set-up, the merge's dispatch)."""
    host_alltoall_us: Figure
    """Host time of one all-to-all or collective (reshapes and copies' dispatch, the collective's set-up)."""
    fitted: str = ""
    """What the figures were fitted on (the dev set's tables, rows and residual); empty: not fitted."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Catalogue:
    """The parsed catalogue.yaml."""

    sources: Mapping[str, str]
    gpus: Mapping[str, Gpu]
    kernels: Mapping[str, Mapping]
    links: Mapping[str, Mapping[str, Figure]]
    overheads: Mapping[str, Figure]
    frameworks: Mapping[str, Framework] = field(default_factory=dict)
    _by_name: Mapping[str, str] = field(default_factory=dict, repr=False)

    def find(self, name: str, field_name: str = "gpu") -> Gpu:
        """A GPU by catalogue key, alias or NVML product name (case and spacing ignored)."""
        key = self._by_name.get(_norm(name)) if isinstance(name, str) else None
        if key is None:
            raise bad_value(field_name, name, "a GPU of the catalogue (ringbench plan --list-gpus): "
                            + ", ".join(sorted(self.gpus)) + ", or its NVML product name")  # fmt: skip
        return self.gpus[key]

    def kernel_title(self, family: str) -> str:
        return str(self.kernels.get(family, {}).get("title", family))

    def kernel_params(self, family: str, arch: str) -> tuple[PassModel, PassModel, float]:
        entry = self.kernels[family].get(arch)
        if entry is None:
            raise bad_value("attention", family, f"a kernel with parameters for the {arch} architecture")
        if "same_as" in entry:
            entry = self.kernels[family][entry["same_as"]]
        return PassModel(**entry["fwd"]), PassModel(**entry["bwd"]), float(entry["call_us"]["value"])

    def kernel_provenance(self, family: str, arch: str) -> str:
        """One line: the curves the kernel model was fitted to (source keys), or how it was derived."""
        entry = self.kernels[family][arch]
        if "same_as" in entry:
            base = self.kernels[family][entry["same_as"]]
            return f"derived: {entry.get('derived', '')} (fitted on {base.get('fitted_on')}, {_curve_sources(base)})"
        return f"fitted on {entry.get('fitted_on')} to {_curve_sources(entry)}"

    def framework(self, name: str, field_name: str = "framework") -> Framework:
        """An implementation family by key or alias (case ignored); otherwise one line naming the choices."""
        wanted = _norm(name) if isinstance(name, str) else None
        for key, family in self.frameworks.items():
            if wanted in (key, *map(_norm, family.aliases)):
                return family
        raise bad_value(field_name, name, "one of the catalogue's implementation families: "
                        + ", ".join(self.frameworks))  # fmt: skip

    def link(self, group: str, name: str) -> Figure:
        return self.links[group][name]

    def overhead(self, name: str) -> Figure:
        return self.overheads[name]


def _curve_sources(entry: Mapping) -> str:
    measured = entry["measured"]
    keys = dict.fromkeys([measured["source"], *(c["source"] for c in measured["curves"] if "source" in c)])
    return "curves of " + ", ".join(keys)


def _norm(name: str) -> str:
    return " ".join(name.strip().lower().replace("_", "-").split())


def _figure(raw: object, sources: Mapping[str, str], where: str) -> Figure:
    if isinstance(raw, Mapping) and "value" in raw and (raw.get("source") or raw.get("derived")):
        source_key = raw.get("source", "")
        if source_key and source_key not in sources:
            raise UsageError(f"catalogue: {where}.source={source_key!r} is not a key of sources")
        return Figure(
            value=float(raw["value"]),
            source=sources.get(source_key, ""),
            source_key=str(source_key),
            derived=str(raw.get("derived", "")),
        )
    raise UsageError(f"catalogue: {where} is not a figure (a mapping with value and source)")


def _gpu(key: str, raw: Mapping, sources: Mapping[str, str], catalogue_ref: list) -> Gpu:
    figures: dict[str, Figure] = {}
    for name in ("sms", "boost_ghz", "memory_gbps", "pcie_gen"):
        figures[name] = _figure(raw[name], sources, f"gpus.{key}.{name}")
    for dtype, value in raw["dense_tflops"].items():
        figures[f"dense_tflops.{dtype}"] = _figure(value, sources, f"gpus.{key}.dense_tflops.{dtype}")
    nvlink = raw.get("nvlink")
    if nvlink:
        cited = str(nvlink.get("source", ""))
        for name in ("generation", "links", "gbps_per_link"):
            figures[f"nvlink.{name}"] = Figure(value=float(nvlink[name]), source=sources.get(cited, ""), source_key=cited,
                                               derived=nvlink.get("note", ""))  # fmt: skip
    return Gpu(key=key, names=tuple(raw["names"]), aliases=tuple(raw.get("aliases", ())), arch=str(raw["arch"]),
               figures=figures, kernels=tuple(raw["kernels"]), catalogue=catalogue_ref[0])  # fmt: skip


def _framework(key: str, raw: Mapping, sources: Mapping[str, str]) -> Framework:
    where = f"frameworks.{key}"
    figures = {name: _figure(raw[name], sources, f"{where}.{name}") for name in ("host_call_us", "host_step_us",
               "host_alltoall_us")}  # fmt: skip
    return Framework(key=key, title=str(raw.get("title", key)), aliases=tuple(raw.get("aliases", ())),
                     fitted=str(raw.get("fitted", "")), **figures)  # fmt: skip


class _Ref(list):
    """Late binding of the Catalogue into its Gpu records (frozen dataclasses)."""


@cache
def load_catalogue() -> Catalogue:
    """The packaged catalogue.yaml, parsed once (yaml.safe_load)."""
    import yaml

    text = resources.files("ringbench.hardware").joinpath("catalogue.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    sources = {str(k): str(v) for k, v in raw["sources"].items()}
    links = {group: {name: (_figure(v, sources, f"links.{group}.{name}") if isinstance(v, Mapping) and "value" in v
                            else v) for name, v in entries.items()}
             for group, entries in raw["links"].items()}  # fmt: skip
    overheads = {name: _figure(v, sources, f"overheads.{name}") for name, v in raw["overheads"].items()}
    frameworks = {str(key): _framework(str(key), value, sources) for key, value in raw.get("frameworks", {}).items()}
    ref: list = [None]
    gpus_raw = raw["gpus"]
    catalogue = Catalogue(sources=sources, gpus={}, kernels=raw["kernels"], links=links, overheads=overheads,
                          frameworks=frameworks)  # fmt: skip
    ref[0] = catalogue
    gpus = {key: _gpu(key, value, sources, ref) for key, value in gpus_raw.items()}
    by_name: dict[str, str] = {}
    for key, gpu in gpus.items():
        for name in (key, *gpu.aliases, *gpu.names):
            by_name[_norm(name)] = key
    object.__setattr__(catalogue, "gpus", gpus)
    object.__setattr__(catalogue, "_by_name", by_name)
    return catalogue


def find_gpu(name: str, field_name: str = "gpu") -> Gpu:
    """A GPU of the catalogue by key, alias or NVML product name; otherwise one line naming the choices."""
    return load_catalogue().find(name, field_name)


def find_framework(name: str, field_name: str = "framework") -> Framework:
    """An implementation family of the catalogue by key or alias; otherwise one line naming the choices."""
    return load_catalogue().framework(name, field_name)


__all__ = ["ATTENTION_DTYPES", "Catalogue", "Figure", "Framework", "Gpu", "find_framework", "find_gpu",
           "load_catalogue"]  # fmt: skip
