"""`ringbench probe`: measure latency and bandwidth of every ordered pair of ranks (a ping-pong matrix).

For each ordered pair (src, dst), one pair at a time while the other ranks wait at a barrier, ``src`` sends a
message of each size to ``dst`` and ``dst`` answers with a message of the smallest size; ``src`` times the round
trip. Per ordered pair:

    latency_us     = median round trip at the smallest size / 2               (half round trip)
    bandwidth_gbps = (largest - smallest) / (min rtt(largest) - min rtt(smallest))

The difference of round trips cancels the fixed costs (both latencies and the answer), leaving the time to move the
extra bytes from src to dst, so the bandwidth is directional. It uses the fastest round trips: being descheduled
(several ranks on few cores) only ever adds time, and one slow sample in two would otherwise halve a bandwidth.
Every wait is bounded by the timeout.

How a round trip is timed depends on who does the work. gloo (CPU): the host does it, so the host clock times each
round trip. NCCL (GPU): the host only enqueues, and host polling plus a synchronize per round trip would time the
host (a 20 us sleep is about 80 us; on NVLink that is all noise), so each sample is ``batch`` back-to-back
ping-pongs enqueued without a host wait, timed by two CUDA events on the stream that runs them, divided by
``batch``; the one wait, for the end event, is polled and bounded by the timeout.

With an emulated topology (``--emulate-links FILE``) each message is delayed on arrival by the link's
``latency + bytes / bandwidth``, exactly as `ringbench run --emulate-links` delays ring transfers
(`ringbench.rank.injection.RankFaults.link_delay`), so the matrix shows the emulated cluster. One pair is active at a time, so
no hop shares a network link with another.

Results go to ``results/<run-id>/``: meta.json (``"probe"``: the matrices; ``"topology"``: the measured topology,
`from_probe_matrix`), probe.parquet (one row per round trip) and probe_heatmap.png.
"""

from __future__ import annotations

import io
import math
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench.errors import RunFailure, bad_value

DEFAULT_SIZES = (8, 64 * 1024, 1024 * 1024)
DEFAULT_REPEATS = 5
DEFAULT_WARMUP = 1
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_BATCH = 20
MAX_PROBE_BYTES = 1 << 30
PROBE_FILE = "probe.parquet"
HEATMAP_FILE = "probe_heatmap.png"
SIZES_HELP = "comma-separated byte counts with an optional unit: 8,64KiB,1MiB (KiB/MiB/GiB, KB/MB/GB, k/m/g)"

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_sizes(text: str | Sequence[int], field_name: str = "sizes") -> tuple[int, ...]:
    """``"8,64KiB,1MiB"`` -> (8, 65536, 1048576), sorted and without duplicates."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    sizes = set()
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            value = part
        else:
            match = _SIZE_RE.match(str(part))
            unit = match.group(2).lower() if match else None
            if match is None or unit not in _UNITS:
                raise bad_value(field_name, text, SIZES_HELP)
            value = float(match.group(1)) * _UNITS[unit]
            if value != int(value):
                raise bad_value(field_name, text, "whole byte counts")
            value = int(value)
        if not 1 <= value <= MAX_PROBE_BYTES:
            raise bad_value(field_name, text, f"sizes between 1 byte and {MAX_PROBE_BYTES >> 30} GiB")
        sizes.add(value)
    if not sizes:
        raise bad_value(field_name, text, SIZES_HELP)
    return tuple(sorted(sizes))


def format_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeSpec:
    """What every rank runs (picklable: it travels to spawned workers)."""

    sizes: tuple[int, ...] = DEFAULT_SIZES
    repeats: int = DEFAULT_REPEATS
    warmup: int = DEFAULT_WARMUP
    timeout_s: float = DEFAULT_TIMEOUT_S
    link_model: dict | None = None
    """Emulated links (`Scenario.link_model` form), or None for the real network."""
    batch: int = DEFAULT_BATCH
    """NCCL: back-to-back ping-pongs per sample, timed together with CUDA events (gloo: 1, host-timed)."""

    def validate(self) -> ProbeSpec:
        parse_sizes(list(self.sizes))
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise bad_value("round_trips", self.repeats, "an integer >= 1")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise bad_value("warmup", self.warmup, "an integer >= 0")
        ok = isinstance(self.timeout_s, (int, float)) and not isinstance(self.timeout_s, bool)
        if not ok or not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise bad_value("timeout", self.timeout_s, "a number of seconds > 0")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise bad_value("batch", self.batch, "an integer >= 1")
        return self


# -- the per-rank part ------------------------------------------------------------------------------------------------


class _Wire:
    """gloo: bounded point-to-point messages of one rank, timed by the host, with the emulated link delay applied
    on arrival."""

    def __init__(self, rank: int, backend: str, device, timeout_s: float, link_model: dict | None) -> None:
        from ringbench.rank.injection import RankFaults

        self.rank = rank
        self.backend = backend
        self.device = device
        self.timeout_s = timeout_s
        # No ring: one pair talks at a time, so a NET hop has its host's network link to itself.
        self.delay = RankFaults(rank=rank, link_model=link_model).link_delay() if link_model else None

    def _wait(self, work, what: str, peer: int) -> None:
        ok = work.wait(timedelta(seconds=self.timeout_s))  # gloo: the host does the transfer (NCCL: _DeviceWire)
        if not ok:
            raise RunFailure(f"rank {self.rank}: {what} rank {peer} did not complete within {self.timeout_s:g} s")

    def send(self, buffer, dst: int) -> None:
        import torch.distributed as dist

        self._wait(dist.isend(buffer, dst), "send to", dst)

    def recv(self, buffer, src: int) -> None:
        import torch.distributed as dist

        self._wait(dist.irecv(buffer, src), "receive from", src)
        if self.delay is not None:  # the block arrives that much later, as in RingComm's watcher
            time.sleep(self.delay(src, self.rank, buffer.numel() * buffer.element_size()))


class _DeviceWire:
    """NCCL: round trips enqueued back to back on the device and timed there with CUDA events.

    Each message is a one-op ``batch_isend_irecv``, whose ``wait()`` on NCCL orders the current stream after the
    transfer and returns at once, so a batch of ping-pongs is enqueued without the host waiting for any of them. A
    batched op goes over the group's own communicator (keyed by the device); a plain ``send`` / ``recv`` would make
    NCCL create a two-rank communicator for every pair the probe visits, N (N - 1) / 2 of them, each with its
    buffers and set-up time. Before the batch the stream busy-waits HOST_LEAD_S per round trip, so the host has
    enqueued the whole batch before the device starts it: the events then time the transfers, not the host's
    enqueueing (a batched op costs the host tens of microseconds, as much as a round trip on NVLink).
    ``runtime`` supplies the stream, the events and the busy-waits (a CudaRuntime; the tests pass a fake whose
    events complete later than recorded); ``dist`` is torch.distributed (injectable likewise)."""

    HOST_LEAD_S = 100e-6

    def __init__(self, rank: int, runtime, timeout_s: float, link_model: dict | None, dist=None) -> None:
        from ringbench.rank.injection import RankFaults

        self.rank = rank
        self.runtime = runtime
        self.timeout_s = timeout_s
        self.delay = RankFaults(rank=rank, link_model=link_model).link_delay() if link_model else None
        if dist is None:
            import torch.distributed as dist
        self.dist = dist

    def _send(self, buffer, dst: int) -> None:
        for work in self.dist.batch_isend_irecv([self.dist.P2POp(self.dist.isend, buffer, dst)]):
            work.wait()

    def _recv(self, buffer, src: int) -> None:
        for work in self.dist.batch_isend_irecv([self.dist.P2POp(self.dist.irecv, buffer, src)]):
            work.wait()
        if self.delay is not None:  # the block arrives that much later: a busy-wait on the stream, as in the ring
            self.runtime.spin(
                self.runtime.current_stream(), self.delay(src, self.rank, buffer.numel() * buffer.element_size())
            )

    def batch(self, message, answer, peer: int, initiator: bool, count: int) -> int | None:
        """``count`` ping-pongs with ``peer`` (initiator: sends ``message``, receives ``answer``; the other side
        answers); returns the initiator's mean round trip in ns (None on the answering side)."""
        stream = self.runtime.current_stream()
        start, end = self.runtime.new_event(), self.runtime.new_event()
        self.runtime.spin(stream, self.HOST_LEAD_S * count)  # the host enqueues the batch while the device waits
        start.record(stream)
        for _ in range(count):
            if initiator:
                self._send(message, peer)
                self._recv(answer, peer)
            else:
                self._recv(message, peer)
                self._send(answer, peer)
        end.record(stream)
        deadline = time.monotonic() + self.timeout_s
        while not end.query():  # the batch's one wait: polled, bounded
            if time.monotonic() > deadline:
                what = "round trips with" if initiator else "answers to"
                raise RunFailure(f"rank {self.rank}: {count} {what} rank {peer} did not complete within "
                                 f"{self.timeout_s:g} s")  # fmt: skip
            time.sleep(1e-3)
        return round(start.elapsed_time(end) * 1e6 / count) if initiator else None


def probe_rank(env, spec: ProbeSpec, *, wire=None, barrier=None) -> dict:
    """Run the whole schedule on this rank; returns the round trips it timed (as src) and where it runs. ``wire``
    and ``barrier``: a _DeviceWire and a barrier to use instead of the backend's (tests)."""
    import torch

    rank, world = env.rank, env.world
    if barrier is None:
        import torch.distributed as dist

        barrier = dist.barrier
    device_wire = wire
    if device_wire is None and env.backend == "nccl":
        from ringbench.engine.timeline import CudaRuntime

        device_wire = _DeviceWire(rank, CudaRuntime(env.device), spec.timeout_s, spec.link_model)
    host_wire = None if device_wire is not None else _Wire(rank, env.backend, env.device, spec.timeout_s,
                                                           spec.link_model)  # fmt: skip
    small = spec.sizes[0]
    buffers = {size: torch.zeros(size, dtype=torch.uint8, device=env.device) for size in spec.sizes}
    answer = torch.zeros(small, dtype=torch.uint8, device=env.device)  # its own buffer: never the one in flight
    samples: list[tuple[int, int, int, int, int]] = []  # (src, dst, size, repeat, rtt_ns)
    for a in range(world):
        for b in range(a + 1, world):
            barrier()  # one pair at a time: nothing else shares the wire or the CPUs
            if rank not in (a, b):
                continue
            for src, dst in ((a, b), (b, a)):
                for size in spec.sizes:
                    peer = dst if rank == src else src
                    for repeat in range(-spec.warmup, spec.repeats):
                        if device_wire is not None:
                            rtt = device_wire.batch(buffers[size], answer, peer, rank == src, spec.batch)
                        elif rank == src:
                            start = time.perf_counter_ns()
                            host_wire.send(buffers[size], dst)
                            host_wire.recv(answer, dst)
                            rtt = time.perf_counter_ns() - start
                        else:
                            host_wire.recv(buffers[size], src)
                            host_wire.send(answer, src)
                            rtt = None
                        if rank == src and repeat >= 0:
                            samples.append((src, dst, size, repeat, rtt))
    barrier()
    return {"rank": rank, "host": socket.gethostname(), "device": str(env.device), "backend": env.backend,
            "launcher": env.launcher, "samples": samples,
            "timing": "cuda events" if device_wire is not None else "host clock"}  # fmt: skip


def probe_worker(worker_ctx, spec: ProbeSpec) -> dict:
    """Entry point inside each rank started by `ringbench.run.launch.launch_local`."""
    return probe_rank(worker_ctx.env, spec)


# -- the whole probe --------------------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class ProbeResult:
    """Matrices indexed [src][dst] (NaN on the diagonal), the raw round trips, and where the ranks ran."""

    world: int
    sizes: tuple[int, ...]
    repeats: int
    warmup: int
    timeout_s: float
    samples: pd.DataFrame
    """One row per timed round trip: src, dst, size_bytes, repeat, rtt_us."""
    rtt_us: dict[int, np.ndarray]
    """Per size: median round trip (message of that size src -> dst, smallest-size answer back)."""
    latency_us: np.ndarray
    bandwidth_gbps: np.ndarray
    hosts: list[str]
    backend: str
    launcher: str
    elapsed_s: float
    emulated_from: str | None = None
    """The topology file whose link costs were injected, or None (a real network)."""
    timing: str = "host clock"
    """How round trips were timed: "host clock" (gloo) or "cuda events" (NCCL, ``batch`` per sample)."""
    batch: int = 1
    """Round trips per sample (their mean is the sample)."""
    topology_doc: dict | None = field(default=None, repr=False)
    """The emulated topology (to_dict), for host names and classes of the measured topology."""

    @property
    def one_way_us(self) -> dict[int, np.ndarray]:
        """Per size: round trip minus the answer's way back (estimated by the reverse pair's latency)."""
        return {size: rtt - self.latency_us.T for size, rtt in self.rtt_us.items()}

    def topology(self):
        """The measured topology (`from_probe_matrix`): hosts and classes kept from an emulated topology."""
        from ringbench.topology.measured import from_probe_matrix
        from ringbench.topology.model import Topology

        latency = np.nan_to_num(self.latency_us, nan=0.0)
        bandwidth = np.nan_to_num(self.bandwidth_gbps, nan=1.0)
        hosts, local, classes = self.hosts, None, None
        if self.topology_doc is not None:
            emulated = Topology.from_dict(self.topology_doc)
            hosts = [device.host for device in emulated.devices]
            local = [device.local_index for device in emulated.devices]
            classes = [[None if label == "X" else label for label in row] for row in emulated.label_matrix()]
        source = "probe" if self.emulated_from is None else f"probe (emulated links: {self.emulated_from})"
        return from_probe_matrix(latency, bandwidth, hosts=hosts, local_indices=local, classes=classes, source=source)

    def to_dict(self) -> dict:
        """The ``"probe"`` document of meta.json (JSON-ready: None on the diagonal)."""
        return {
            "method": (
                "ping-pong per ordered pair, one pair at a time; latency = median round trip at the smallest size / 2; "
                "bandwidth = (largest - smallest bytes) / (min rtt(largest) - min rtt(smallest))"
            ),
            "timing": self.timing,
            "round_trips_per_sample": self.batch,
            "world": self.world,
            "sizes": list(self.sizes),
            "repeats": self.repeats,
            "warmup": self.warmup,
            "timeout": self.timeout_s,
            "backend": self.backend,
            "launcher": self.launcher,
            "hosts": list(self.hosts),
            "emulated_links": self.emulated_from,
            "elapsed_s": round(self.elapsed_s, 3),
            "latency_us": _json_matrix(self.latency_us),
            "bandwidth_gbps": _json_matrix(self.bandwidth_gbps),
            "rtt_us": {str(size): _json_matrix(matrix) for size, matrix in self.rtt_us.items()},
            "one_way_us": {str(size): _json_matrix(matrix) for size, matrix in self.one_way_us.items()},
        }


def _json_matrix(matrix: np.ndarray) -> list[list[float | None]]:
    return [[None if not math.isfinite(value) else round(float(value), 4) for value in row] for row in matrix]


def summarize(per_rank: list[dict], spec: ProbeSpec, world: int, elapsed_s: float) -> ProbeResult:
    """Medians per (size, src, dst) and the latency / bandwidth matrices from every rank's samples."""
    rows = [sample for result in per_rank for sample in result["samples"]]
    samples = pd.DataFrame(rows, columns=["src", "dst", "size_bytes", "repeat", "rtt_ns"])
    samples["rtt_us"] = samples.pop("rtt_ns") / 1e3
    grouped = samples.groupby(["size_bytes", "src", "dst"])["rtt_us"]

    def matrices(values: pd.Series) -> dict[int, np.ndarray]:
        out = {}
        for size in spec.sizes:
            matrix = np.full((world, world), np.nan)
            for (src, dst), value in values.loc[size].items():
                matrix[src, dst] = value
            out[size] = matrix
        return out

    rtt, fastest = matrices(grouped.median()), matrices(grouped.min())
    small, large = spec.sizes[0], spec.sizes[-1]
    latency = rtt[small] / 2.0
    if large > small:
        extra_us = fastest[large] - fastest[small]
        # Noise can make the difference vanish on a fast link: never below the large message's own share.
        extra_us = np.fmax(extra_us, 0.05 * fastest[large])
        bandwidth = (large - small) / extra_us / 1e3  # bytes per microsecond / 1e3 = GB/s
    else:
        bandwidth = large / (fastest[large] / 2.0) / 1e3
    first = per_rank[0]
    return ProbeResult(
        world=world, sizes=tuple(spec.sizes), repeats=spec.repeats, warmup=spec.warmup, timeout_s=spec.timeout_s,
        samples=samples, rtt_us=rtt, latency_us=latency, bandwidth_gbps=bandwidth,
        hosts=[result["host"] for result in sorted(per_rank, key=lambda r: r["rank"])],
        backend=first["backend"], launcher=first["launcher"], elapsed_s=elapsed_s,
        timing=first.get("timing", "host clock"), batch=spec.batch if first.get("timing") == "cuda events" else 1,
    )  # fmt: skip


def emulated_link_model(path: str | Path) -> tuple[dict, dict]:
    """(link_model, topology document) for ``--emulate-links FILE``: the same delays `ringbench run` injects."""
    from ringbench.scenario.scenario import Scenario
    from ringbench.topology.load import load_topology

    topology = load_topology(path)
    model = Scenario(name="probe", world=(topology.world,), topology=str(path), emulate_links=True).link_model()
    return model, topology.to_dict()


def run_probe(
    world: int | None = None,
    *,
    sizes: Sequence[int] | str = DEFAULT_SIZES,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    emulate_links: str | Path | None = None,
    device: str | None = None,
) -> ProbeResult | None:
    """Probe ``world`` local ranks (launch_local), or the torchrun/SLURM group this process belongs to.

    Returns the result on the local parent and on rank 0 of a launched group; None on the other launched ranks.
    ``emulate_links``: a topology file whose link costs are injected as delays (its device count is the default
    world).
    """
    from ringbench.rank.dist import launched_env

    sizes = parse_sizes(sizes if isinstance(sizes, str) else list(sizes))
    model, topology_doc = emulated_link_model(emulate_links) if emulate_links is not None else (None, None)
    emulated_world = len(topology_doc["devices"]) if topology_doc is not None else None
    launched = launched_env()
    if world is None:
        world = launched[1] if launched is not None else (emulated_world or 2)
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise bad_value("world", world, "an integer >= 2 (a pair at least)")
    if emulated_world is not None and world != emulated_world:
        raise bad_value("world", world, f"{emulated_world}, the number of devices in {emulate_links}")
    if launched is not None and launched[1] != world:
        raise bad_value("world", world, f"{launched[1]}, the WORLD_SIZE of this launch")
    spec = ProbeSpec(sizes=sizes, repeats=repeats, warmup=warmup, timeout_s=timeout_s, link_model=model).validate()
    started = time.monotonic()
    if launched is not None:
        per_rank = _probe_launched(spec, device)
        if per_rank is None:
            return None
    else:
        from ringbench.run.launch import launch_local

        per_rank = launch_local(world, probe_worker, (spec,), timeout_s=spec.timeout_s, device=device)
    result = summarize(per_rank, spec, world, time.monotonic() - started)
    if emulate_links is not None:
        result.emulated_from = str(emulate_links)
        result.topology_doc = topology_doc
    return result


def _probe_launched(spec: ProbeSpec, device: str | None) -> list[dict] | None:
    import torch.distributed as dist

    from ringbench.rank.dist import init_launched

    env = init_launched(spec.timeout_s, device)
    try:
        mine = probe_rank(env, spec)
        gathered = [None] * env.world if env.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
    finally:
        dist.destroy_process_group()
    return gathered if env.rank == 0 else None


# -- storing and drawing ----------------------------------------------------------------------------------------------


def save_probe(result: ProbeResult, out: str | Path = "results", *, command: str = "") -> Path:
    """Write ``out/<run-id>/`` (meta.json, probe.parquet, probe_heatmap.png); returns that folder."""
    from ringbench.rank.metadata import collect_environment
    from ringbench.record.atomic import write_bytes
    from ringbench.record.meta import META_FILE
    from ringbench.run.results import ResultsFolder

    topology = result.topology()
    meta = {
        **collect_environment(command),
        "world": result.world,
        "emulated": result.emulated_from is not None,
        "emulated_links": result.emulated_from is not None,
        "probe": result.to_dict(),
        "topology": topology.to_dict(),
        "files": [META_FILE, PROBE_FILE, HEATMAP_FILE],
    }
    folder = ResultsFolder.create(out, "probe", meta, producer="probe")
    buffer = io.BytesIO()
    result.samples.to_parquet(buffer, index=False)
    write_bytes(folder.run_dir / PROBE_FILE, buffer.getvalue())
    write_bytes(folder.run_dir / HEATMAP_FILE, heatmap_png(result))
    folder.finish()  # last: a folder whose meta.json says finished is complete
    return folder.run_dir


def heatmap_png(result: ProbeResult) -> bytes:
    """Latency and bandwidth heatmaps side by side (rows send, columns receive), as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    world = result.world
    size = min(4.0 + 0.35 * world, 14.0)
    figure, axes = plt.subplots(1, 2, figsize=(2 * size + 1.5, size))
    try:
        panels = (
            (result.latency_us, "latency (us, half round trip)", "viridis_r", "{:.0f}"),
            (result.bandwidth_gbps, f"bandwidth (GB/s, {format_bytes(result.sizes[-1])} messages)", "viridis", "{:.2g}"),
        )  # fmt: skip
        for axis, (matrix, title, cmap, fmt) in zip(axes, panels, strict=True):
            image = axis.imshow(np.ma.masked_invalid(matrix), cmap=cmap)
            figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04)
            axis.set_title(title)
            axis.set_xlabel("dst rank")
            axis.set_ylabel("src rank")
            ticks = range(world) if world <= 32 else range(0, world, max(1, world // 16))
            axis.set_xticks(list(ticks))
            axis.set_yticks(list(ticks))
            if world <= 16:
                for i in range(world):
                    for j in range(world):
                        if i != j and math.isfinite(matrix[i, j]):
                            axis.text(j, i, fmt.format(matrix[i, j]), ha="center", va="center", fontsize=8,
                                      color="white", path_effects=_outline())  # fmt: skip
        label = "emulated links: " + Path(result.emulated_from).name if result.emulated_from else "measured"
        figure.suptitle(f"ringbench probe: {world} ranks ({label})")
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()
    finally:
        plt.close(figure)


def _outline():
    import matplotlib.patheffects as effects

    return [effects.withStroke(linewidth=2, foreground="black")]
