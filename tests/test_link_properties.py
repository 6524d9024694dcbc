"""Properties of the one link model over random clusters (seeded loops): every strategy's predicted time follows the
costs of the link classes it uses and ignores the others; the bytes the plan reports per class are the bytes it
prices; emulated links and the simulator share each exchange's sharing rule."""

from __future__ import annotations

import random

import numpy as np
import pytest
import yaml

from ringbench.advise.planner import PlanRequest, price_configurations
from ringbench.rank.injection import RankFaults
from ringbench.scenario.scenario import Scenario
from ringbench.scenario.workload import Workload
from ringbench.simulate.case import Cluster
from ringbench.simulate.costs import Costs
from ringbench.simulate.flows import Prices
from ringbench.topology import topology_from_spec
from ringbench.vocab import Strategy

INTRA = ("NV4", "NV8", "PXB", "PIX", "SYS")
CLASSES = ("NV", "PIX", "PXB", "SYS", "NET")


def _spec(rng: random.Random) -> dict:
    hosts, gpus = rng.choice([(1, 4), (2, 2), (2, 4), (3, 2), (2, 3)])
    spec = {
        "intra": rng.choice(INTRA),
        "inter": "NET",
        "hosts": [{"name": "node", "count": hosts, "gpus": gpus}],
        "class_costs": {"NET": {"latency_us": rng.uniform(2, 50), "bandwidth_gbps": rng.uniform(0.5, 60)}},
    }
    nics = rng.choice([None, "per-gpu", 1, min(2, gpus)])
    if nics is not None:
        spec["nics"] = nics
    return spec


def _configs(rng: random.Random, world: int, heads: int) -> dict[str, dict]:
    """A random sample of candidates the world allows, each with an explicit placement or order."""
    out = {"ring": {"strategy": "ring", "order": rng.choice(["identity", f"random:{rng.randrange(99)}"])},
           "allgather": {"strategy": "allgather"}}  # fmt: skip
    for degree in range(2, world + 1):
        if world % degree or heads % degree:
            continue
        spec = "ulysses" if degree == world else f"hybrid:{degree}"
        out[spec] = {"strategy": spec, "placement": rng.choice(["heads-first", "interleaved", f"random:{degree}"])}
    for width in range(2, world):
        if world % width == 0:
            out[f"double-ring:{width}"] = {"strategy": f"double-ring:{width}",
                                           "placement": rng.choice(["heads-first", "interleaved"])}  # fmt: skip
    keep = rng.sample(sorted(out), k=min(4, len(out)))
    return {name: out[name] for name in keep}


def _price(spec: dict, configs: dict, gpu: str | None, world: int, backward: bool) -> dict:
    topology = topology_from_spec(spec)
    workload = Workload(world=world, seq=world * 2 * 256, heads=12, kv_heads=12, head_dim=64)
    request = PlanRequest(workload=workload, topology=topology, backward=backward, gpu=gpu, detect=False)
    priced = price_configurations(request, configs, found_gpus=[])
    return {name: (c.step_ms, dict(c.mib_by_class)) for name, c in priced.items()}


def _with_cost(spec: dict, label: str, **change: float) -> dict:
    out = {**spec, "class_costs": {k: dict(v) for k, v in spec["class_costs"].items()}}
    kind = label.rstrip("0123456789")
    row = out["class_costs"].setdefault(kind, {})
    base = {"NV": (2.0, 25.0), "PIX": (3.0, 24.0), "PXB": (3.5, 22.0), "SYS": (6.0, 14.0), "NET": (10.0, 12.5)}[kind]
    row.setdefault("latency_us", base[0])
    row.setdefault("bandwidth_gbps", base[1])
    if "bandwidth" in change:
        row["bandwidth_gbps"] = row["bandwidth_gbps"] * change["bandwidth"]
    if "latency" in change:
        row["latency_us"] = row["latency_us"] * change["latency"]
    return out


@pytest.mark.parametrize(
    ("gpu", "clusters"),
    [(None, 3), ("h100-sxm", 3), pytest.param(None, 20, marks=pytest.mark.slow),
     pytest.param("l40s", 20, marks=pytest.mark.slow)],
)  # fmt: skip
def test_every_strategy_follows_the_classes_it_uses_and_ignores_the_rest(gpu, clusters):
    rng = random.Random(f"{gpu}-{clusters}")
    checked = 0
    for _ in range(clusters):
        spec = _spec(rng)
        world = sum(h["count"] * h["gpus"] for h in spec["hosts"])
        configs = _configs(rng, world, 12)
        backward = rng.random() < 0.5
        base = _price(spec, configs, gpu, world, backward)
        for kind in CLASSES:
            slower = _price(_with_cost(spec, kind, bandwidth=0.25, latency=3.0), configs, gpu, world, backward)
            faster = _price(_with_cost(spec, kind, bandwidth=4.0, latency=0.3), configs, gpu, world, backward)
            crawling = _price(_with_cost(spec, kind, bandwidth=1e-4), configs, gpu, world, backward)
            for name, (step, by_class) in base.items():
                uses = any(label.rstrip("0123456789") == kind and mib > 0 for label, mib in by_class.items())
                where = (spec, name, kind, backward)
                if uses:
                    assert slower[name][0] >= step * (1 - 1e-9), where
                    assert faster[name][0] <= step * (1 + 1e-9), where
                    assert crawling[name][0] > step, where  # the bytes it reports are bytes it prices
                    checked += 1
                else:
                    assert slower[name][0] == pytest.approx(step, rel=1e-12), where
                    assert faster[name][0] == pytest.approx(step, rel=1e-12), where
                    assert crawling[name][0] == pytest.approx(step, rel=1e-12), where
    assert checked >= 3 * clusters


def test_the_bytes_reported_per_class_count_every_message():
    spec = {"intra": "NV4", "inter": "NET", "hosts": [{"name": "node", "count": 2, "gpus": 4}],
            "class_costs": {"NET": {"latency_us": 5, "bandwidth_gbps": "100Gbps"}}}  # fmt: skip
    world, seq, heads, dim = 8, 8 * 512, 8, 64
    configs = {"ring": {"strategy": "ring"}, "ulysses": {"strategy": "ulysses"},
               "hybrid": {"strategy": "hybrid:4", "placement": "heads-first"}}  # fmt: skip
    topology = topology_from_spec(spec)
    request = PlanRequest(workload=Workload(world=world, seq=seq, heads=heads, head_dim=dim), topology=topology,
                          backward=False, detect=False)  # fmt: skip
    priced = price_configurations(request, configs, found_gpus=[])
    shard = seq // world * heads * dim * 2  # one rank's Q (or K, or V) in bfloat16, bytes
    mib = 2**20
    # ring, identity: 2 of 8 hops cross hosts; N - 1 K/V blocks over every hop
    ring = priced["ring"].mib_by_class
    assert ring["NET"] * world * mib == pytest.approx(2 * (world - 1) * 2 * shard)
    assert ring["NV4"] * world * mib == pytest.approx(6 * (world - 1) * 2 * shard)
    # Ulysses: in (Q, K, V) and out (O), each rank sends 1/N of them to every other rank; 4 of 7 peers cross
    total = priced["ulysses"].mib_by_class
    per_rank = 4 * shard * (world - 1) / world
    assert sum(total.values()) * mib == pytest.approx(per_rank)
    assert total["NET"] * mib == pytest.approx(4 * shard * 4 / world)
    # hybrid:4 heads-first: its all-to-alls stay inside the hosts; the ring across 2 groups crosses them
    hybrid = priced["hybrid"].mib_by_class
    assert hybrid["NET"] * world * mib == pytest.approx(world * 1 * 2 * shard)  # 1 K/V block per rank per ring
    assert priced["hybrid"].net_mb == hybrid["NET"]


def test_emulated_links_and_the_simulator_share_an_exchange_alike(tmp_path):
    rng = random.Random(7)
    for _ in range(6):
        spec = _spec(rng)
        topology = topology_from_spec(spec)
        world = topology.world
        flows = [(a, b) for a in range(world) for b in range(world) if a != b and rng.random() < 0.6]
        if not flows:
            continue
        path = tmp_path / "cluster.yaml"
        path.write_text(yaml.safe_dump(spec))
        matrices = Scenario(world=(world,), topology=str(path), emulate_links=True).link_model()  # as a run ships
        prices = Prices(Costs(), Cluster(topology=topology, emulate_links=True))
        simulated = prices.shares(flows, flows)
        delay = RankFaults(rank=0, link_model=matrices)
        for (src, dst), share in zip(flows, simulated, strict=True):
            assert delay._flow_sharing(src, dst, tuple(flows)) == pytest.approx(share), (spec, src, dst)


def test_an_all_to_all_across_hosts_shares_the_hosts_nics():
    """Ulysses over 2 hosts x 4: each rank sends 4 of its 7 chunks to the other host; one NIC per host carries
    16 flows each way, one NIC per GPU 4: the prediction follows the NIC count."""
    base = {"intra": "NV8", "inter": "NET", "hosts": [{"name": "node", "count": 2, "gpus": 4}],
            "class_costs": {"NET": {"latency_us": 5, "bandwidth_gbps": "100Gbps"}}}  # fmt: skip
    steps = {}
    for nics in ("per-host", 2, "per-gpu"):
        spec = {**base, "nics": nics}
        topology = topology_from_spec(spec)
        request = PlanRequest(workload=Workload(world=8, seq=8 * 4096, heads=8, head_dim=128), topology=topology,
                              backward=False, gpu="h100-sxm", detect=False)  # fmt: skip
        steps[nics] = price_configurations(request, {"u": {"strategy": "ulysses"}}, found_gpus=[])["u"].step_ms
        flows = [(a, b) for a in range(8) for b in range(8) if a != b]
        prices = Prices(Costs(), Cluster(topology=topology))
        shares = prices.shares(flows, flows)
        crossing = [share for (a, b), share in zip(flows, shares, strict=True) if (a < 4) != (b < 4)]
        assert max(crossing) == {"per-host": 16, 2: 8, "per-gpu": 4}[nics]
    assert steps["per-host"] > steps[2] > steps["per-gpu"]


def test_a_ulysses_degree_above_the_kv_heads_prices_their_repeats():
    spec = {"intra": "NV8", "hosts": [{"name": "node", "gpus": 8}]}
    topology = topology_from_spec(spec)
    priced = {}
    for kv in (8, 2):
        request = PlanRequest(workload=Workload(world=8, seq=8 * 1024, heads=8, kv_heads=kv, head_dim=128),
                              topology=topology, backward=False, gpu="h100-sxm", detect=False)  # fmt: skip
        priced[kv] = price_configurations(request, {"u": {"strategy": "ulysses"}}, found_gpus=[])["u"]
    # 2 KV heads repeated up to the degree 8 move and hold as much as 8 KV heads would
    assert priced[2].mib_by_class == pytest.approx(priced[8].mib_by_class)
    assert priced[2].memory_mb == pytest.approx(priced[8].memory_mb)
    assert Strategy.parse("ulysses").ulysses_degree(8) == 8
    assert np.isfinite(priced[2].step_ms)


def test_a_figure_the_file_leaves_out_is_priced_at_the_gpus_prior():
    """Over random clusters priced for a GPU: a class stated by its bandwidth alone prices exactly as the same
    class stated with the GPU's prior latency beside it, and the plan's lines call that class GIVEN."""
    from ringbench.hardware import find_gpu
    from ringbench.simulate.priors import gpu_prior

    rng = random.Random("left-out")
    prior = gpu_prior(find_gpu("h100-sxm"), "bfloat16")
    for _ in range(3):
        spec = _spec(rng)
        world = sum(h["count"] * h["gpus"] for h in spec["hosts"])
        configs = _configs(rng, world, 12)
        kind = rng.choice(["NET", "SYS", "PIX"])
        bandwidth = rng.uniform(1, 40)
        alone = {**spec, "class_costs": {**spec["class_costs"], kind: {"bandwidth_gbps": bandwidth}}}
        explicit = {**spec, "class_costs": {**spec["class_costs"], kind: {
            "bandwidth_gbps": bandwidth, "latency_us": prior.class_costs[kind]["latency_us"]}}}  # fmt: skip
        first, second = _price(alone, configs, "h100-sxm", world, False), _price(explicit, configs, "h100-sxm",
                                                                                 world, False)  # fmt: skip
        for name in configs:
            assert first[name][0] == pytest.approx(second[name][0], rel=1e-12), (spec, kind, name)
        lines = {s.cost: s for s in prior.for_topology(topology_from_spec(alone)).sources if s.cost.startswith("link.")}
        assert lines[f"link.{kind}"].given and "PRIOR" in lines[f"link.{kind}"].how  # its latency stays a prior
