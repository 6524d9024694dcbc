"""Real network namespaces as emulated hosts: two namespaces joined by a rate-limited veth pair (Linux, root only).

Where injected delays (``--emulate-links``) model a cluster, this builds one out of the kernel's own network stack:

    namespace A (host "node0", ranks 0..k-1)  10.200.0.1 --veth--  10.200.0.2  namespace B (host "node1", ranks k..)
                                              tbf rate limit on both ends of the veth (each direction)

Ranks of one namespace reach each other through its local route (fast); every byte between the namespaces crosses
the veth, whose token bucket (``tc qdisc ... tbf``) limits it to ``rate``, so ring hops between the two "hosts" share
one slow link exactly as GPUs of two servers share their network link. Each rank is a separate process started
with ``ip netns exec NS python -m ringbench.experiments.netns_rank``; gloo binds to the namespace's veth
(GLOO_SOCKET_IFNAME) and rank 0's address is the master. The rank runs cases with `ringbench.rank.runner.run_case` and
prints one JSON line per case; the parent summarises them like `ringbench run` does.

Only addresses inside namespaces created here are touched (10.200.0.0/24 by default); everything is deleted in a
``finally``, also on failure. `netns_unavailable()` says why the machine cannot do this (not root, no ``ip``/``tc``,
``ip netns add`` refused), so tests skip cleanly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ringbench.errors import RunFailure, UsageError

RESULT_PREFIX = "RINGBENCH_NETNS_RESULT "
DEFAULT_SUBNET = "10.200.0"
MASTER_PORT = 29531
_REPO_ROOT = Path(__file__).resolve().parents[2]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def netns_unavailable() -> str | None:
    """Why real namespaces cannot be used here (None when they can): not root, no ip/tc, or netns add refused."""
    if sys.platform != "linux":
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    name = f"rbchk{os.getpid()}"
    try:
        result = _ip("netns", "add", name, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"ip netns add failed ({exc})"
    if result.returncode != 0:
        return f"ip netns add failed: {result.stderr.strip() or result.returncode}"
    _ip("netns", "del", name, check=False)
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class NetnsHost:
    namespace: str
    interface: str
    address: str


@dataclass(frozen=True, kw_only=True, slots=True)
class NetnsCluster:
    hosts: tuple[NetnsHost, NetnsHost]
    rate: str
    burst: str
    latency: str

    def describe(self) -> str:
        a, b = self.hosts
        return (
            f"namespaces {a.namespace} ({a.address}) and {b.namespace} ({b.address}) joined by a veth pair, "
            f"tbf rate {self.rate} burst {self.burst} latency {self.latency} on both ends"
        )


@contextlib.contextmanager
def two_host_cluster(
    *, rate: str = "50mbit", burst: str = "32kbit", latency: str = "50ms", subnet: str = DEFAULT_SUBNET
) -> Iterator[NetnsCluster]:
    """Create two namespaces joined by a rate-limited veth pair; delete them (and the veth) on exit, always."""
    reason = netns_unavailable()
    if reason is not None:
        raise UsageError(reason)
    tag = f"{os.getpid() % 100000}"
    hosts = (
        NetnsHost(namespace=f"rb{tag}a", interface=f"rb{tag}va", address=f"{subnet}.1"),
        NetnsHost(namespace=f"rb{tag}b", interface=f"rb{tag}vb", address=f"{subnet}.2"),
    )
    created: list[str] = []
    try:
        for host in hosts:
            _ip("netns", "add", host.namespace)
            created.append(host.namespace)
        a, b = hosts
        # Both ends are created directly inside their namespaces: nothing appears in the caller's namespace.
        _ip("link", "add", a.interface, "netns", a.namespace, "type", "veth",
            "peer", "name", b.interface, "netns", b.namespace)  # fmt: skip
        for host in hosts:
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
            subprocess.run(
                ["ip", "netns", "exec", host.namespace, "tc", "qdisc", "add", "dev", host.interface, "root", "tbf",
                 "rate", rate, "burst", burst, "latency", latency],
                capture_output=True, text=True, timeout=20, check=True,
            )  # fmt: skip
        yield NetnsCluster(hosts=hosts, rate=rate, burst=burst, latency=latency)
    except subprocess.CalledProcessError as exc:
        raise RunFailure(f"network namespace setup failed: {' '.join(exc.cmd)}: {exc.stderr.strip()}") from None
    finally:
        for namespace in created:  # deleting a namespace deletes its end of the veth, and with it the pair
            _ip("netns", "del", namespace, check=False)


def namespaces_left(prefix: str = "rb") -> list[str]:
    """Namespaces named like ours that still exist (for tests checking the cleanup)."""
    result = _ip("netns", "list", check=False)
    names = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    tag = f"{prefix}{os.getpid() % 100000}"
    return [name for name in names if name.startswith(tag)]


def run_cases_in_namespaces(
    cluster: NetnsCluster,
    cases: Sequence,
    settings,
    *,
    ranks_per_host: int,
    timeout_s: float = 60.0,
) -> list[list[dict]]:
    """Run ``cases`` (same world) on ranks split over the two namespaces; per case, the per-rank results.

    Ranks 0..ranks_per_host-1 live in the first namespace, the rest in the second (as a topology with two hosts
    lists them). Every wait inside a rank is bounded by ``settings.timeout``; the whole launch by ``timeout_s``,
    after which the ranks are killed.
    """
    world = 2 * ranks_per_host
    if any(case.world != world for case in cases):
        raise UsageError(f"every case must have world={world} (2 namespaces x {ranks_per_host} ranks)")
    master = cluster.hosts[0].address
    with tempfile.TemporaryDirectory(prefix="ringbench-netns-") as folder:
        spec_path = Path(folder) / "spec.json"
        spec_path.write_text(json.dumps({"cases": [c.axes() for c in cases], "settings": dataclasses.asdict(settings)}))
        procs = []
        try:
            for rank in range(world):
                host = cluster.hosts[rank // ranks_per_host]
                env = {
                    **os.environ,
                    "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % ranks_per_host),
                    "MASTER_ADDR": master, "MASTER_PORT": str(MASTER_PORT), "GLOO_SOCKET_IFNAME": host.interface,
                    "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                    "PYTHONPATH": os.pathsep.join(p for p in (str(_REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
                    "RINGBENCH_NETNS_SPEC": str(spec_path),
                }  # fmt: skip
                command = [
                    "ip",
                    "netns",
                    "exec",
                    host.namespace,
                    sys.executable,
                    "-m",
                    "ringbench.experiments.netns_rank",
                ]
                proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                procs.append(proc)
            deadline = time.monotonic() + timeout_s
            outputs = []
            for rank, proc in enumerate(procs):
                try:
                    out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    raise RunFailure(f"rank {rank} (netns) did not finish within {timeout_s:g} s") from None
                if proc.returncode != 0:
                    last = (err.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
                    raise RunFailure(f"rank {rank} (netns {cluster.hosts[rank // ranks_per_host].namespace}): {last}")
                outputs.append(out)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=5)
    per_case: dict[str, list] = {case.case_id: [] for case in cases}
    for out in outputs:
        for line in out.splitlines():
            if line.startswith(RESULT_PREFIX):
                from ringbench.rank.rank_report import RankReport

                result = RankReport.from_dict(json.loads(line[len(RESULT_PREFIX) :]))
                per_case[result.case_id].append(result)
    return [sorted(per_case[case.case_id], key=lambda r: r.rank) for case in cases]


def compare_orders_in_namespaces(
    orders: Sequence[str],
    *,
    ranks_per_host: int = 2,
    seq: int = 1024,
    heads: int = 4,
    head_dim: int = 32,
    kernel: str = "emulated:50",
    iters: int = 4,
    warmup: int = 1,
    rate: str = "50mbit",
    burst: str = "32kbit",
    latency: str = "50ms",
    timeout_s: float = 60.0,
) -> dict:
    """Median step time (ms) of each ring order on the two-namespace cluster, measured in one process group.

    Returns {"step_ms": {order: ms}, "cases": [case rows], "cluster": description, "block_bytes": bytes per hop}.
    """
    from ringbench.rank.runner import RunSettings
    from ringbench.run.results import summarize_case
    from ringbench.scenario.scenario import Scenario

    scenario = Scenario(
        name="netns", world=(2 * ranks_per_host,), seq=(seq,), heads=(heads,), head_dim=(head_dim,), mask=("none",),
        buffer=("double",), kernel=(kernel,), order=tuple(orders), backward=False, iters=iters, warmup=warmup,
        check=False, timeout=min(timeout_s, 60.0),
    ).validate()  # fmt: skip
    cases = scenario.cases()
    settings = RunSettings.of(scenario)
    with two_host_cluster(rate=rate, burst=burst, latency=latency) as cluster:
        results = run_cases_in_namespaces(cluster, cases, settings, ranks_per_host=ranks_per_host, timeout_s=timeout_s)
        description = cluster.describe()
    rows = []
    for case, per_rank in zip(cases, results, strict=True):
        if len(per_rank) != case.world:
            raise RunFailure(f"case {case.case_id}: {len(per_rank)} of {case.world} ranks reported")
        rows.append(summarize_case(case, per_rank, scenario, 0)[1])
    block_bytes = 2 * (seq // (2 * ranks_per_host)) * heads * head_dim * 4
    return {
        "step_ms": {row["order"]: row["step_ms"] for row in rows},
        "cases": rows,
        "cluster": description,
        "block_bytes": block_bytes,
    }
