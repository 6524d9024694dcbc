"""`recommend`: the ring order that minimises the worst hop, then the total, and what it would change.

Guarantees: for worlds up to ``exact_limit`` (12 by default) the order is optimal for the cost model (exact.py); beyond
it, hierarchical construction plus local search (heuristic.py) within ``time_budget_s``. The current order is kept
when it is already as good (no churn), and a topology where every ring costs the same is reported as such.

The optimizer ranks hops alone (a (max, sum) objective an exact search can take); the predicted speedup prices each
ring's step with the one link model (topology/linkmodel.py: NET hops between the same two hosts share that link),
as emulated links and the simulator do, and a ring slower per step than the current one is never recommended.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ringbench.errors import UsageError, bad_value
from ringbench.fmt import ring_text
from ringbench.orders import parse_order, validate_ring
from ringbench.topology.exact import MAX_EXACT, solve_exact
from ringbench.topology.heuristic import hierarchical
from ringbench.topology.linkmodel import ring_links
from ringbench.topology.model import Topology

DEFAULT_EXACT_LIMIT = 12
DEFAULT_TIME_BUDGET_S = 4.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Hop:
    """One hop of a ring: ring position ``position`` sends to ``position + 1``."""

    position: int
    src: int
    dst: int
    link_class: str
    cost_us: float
    """The hop alone: latency + the reference message / its bandwidth (what the optimizer ranks)."""
    share: int = 1
    """Ring hops sharing this hop's link in one step (NET hops between the same two hosts; topology/linkmodel.py)."""
    shared_us: float = 0.0
    """The hop while the whole ring step moves its blocks: its bandwidth divided by ``share``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Recommendation:
    """A recommended ring order, compared hop by hop with the current one, plus launcher-ready forms."""

    order: tuple[int, ...]
    """Ranks in recommended ring order, starting at 0."""
    current_order: tuple[int, ...]
    hops: tuple[Hop, ...]
    current_hops: tuple[Hop, ...]
    worst_hop_class: str | None
    """Class of the recommended ring's most expensive hop (None for a single device)."""
    current_worst_hop_class: str | None
    worst_hop_us: float
    current_worst_hop_us: float
    total_us: float
    current_total_us: float
    step_us: float
    """The recommended ring's communication per ring step: its slowest hop with NIC sharing (topology/linkmodel.py),
    the model `--emulate-links` injects and the simulator prices."""
    current_step_us: float
    predicted_speedup: float
    """current_step_us / step_us: the link model's ratio of communication time per ring step."""
    model: str
    """The cost model, in words."""
    message_bytes: int
    """The cost model's reference message (bytes per hop per ring step)."""
    all_equivalent: bool
    """Every ring order costs the same on this topology (e.g. an NVSwitch board): nothing to gain from reordering."""
    equivalence_reason: str
    """Why every order is equivalent, in words ("" when they are not)."""
    current_is_optimal: bool
    """The current order is already as good as the recommendation (it is then the recommendation)."""
    exact: bool
    """True when the order is provably optimal for the model (exact search or all orders equivalent)."""
    method: str
    elapsed_s: float
    cuda_visible_devices: tuple[tuple[str, str], ...]
    """Per host, its devices' local indices in ring-visit order (for CUDA_VISIBLE_DEVICES with an identity ring)."""
    cuda_visible_devices_exact: bool
    """True when identity rank order under those CUDA_VISIBLE_DEVICES reproduces the recommended ring."""

    @property
    def order_arg(self) -> str:
        """The ``--order`` value for `ringbench run`, e.g. ``0-3-1-2``."""
        return ring_text(self.order)

    @property
    def predicted_step_change_pct(self) -> float:
        """Predicted change of communication time per ring step, percent (negative is faster)."""
        return (1.0 / self.predicted_speedup - 1.0) * 100.0

    def hop_class_counts(self, current: bool = False) -> dict[str, int]:
        return dict(Counter(hop.link_class for hop in (self.current_hops if current else self.hops)))

    def to_dict(self) -> dict:
        def hops(items: tuple[Hop, ...]) -> list[dict]:
            return [
                {
                    "position": h.position,
                    "src": h.src,
                    "dst": h.dst,
                    "class": h.link_class,
                    "cost_us": h.cost_us,
                    "share": h.share,
                    "shared_us": h.shared_us,
                }
                for h in items
            ]

        return {
            "order": list(self.order),
            "order_arg": self.order_arg,
            "ranks": list(self.order),
            "current_order": list(self.current_order),
            "worst_hop_class": self.worst_hop_class,
            "current_worst_hop_class": self.current_worst_hop_class,
            "worst_hop_us": self.worst_hop_us,
            "current_worst_hop_us": self.current_worst_hop_us,
            "total_us": self.total_us,
            "current_total_us": self.current_total_us,
            "step_us": self.step_us,
            "current_step_us": self.current_step_us,
            "predicted_speedup": self.predicted_speedup,
            "predicted_step_change_pct": self.predicted_step_change_pct,
            "model": self.model,
            "message_bytes": self.message_bytes,
            "all_equivalent": self.all_equivalent,
            "equivalence_reason": self.equivalence_reason,
            "current_is_optimal": self.current_is_optimal,
            "exact": self.exact,
            "method": self.method,
            "elapsed_s": self.elapsed_s,
            "hop_classes": self.hop_class_counts(),
            "current_hop_classes": self.hop_class_counts(current=True),
            "hops": hops(self.hops),
            "current_hops": hops(self.current_hops),
            "cuda_visible_devices": dict(self.cuda_visible_devices),
            "cuda_visible_devices_exact": self.cuda_visible_devices_exact,
        }


def rotate_to_zero(order: Sequence[int]) -> list[int]:
    """The same ring, read from rank 0."""
    order = list(order)
    start = order.index(0)
    return order[start:] + order[:start]


def _hops(topology: Topology, cost: np.ndarray, order: list[int]) -> tuple[Hop, ...]:
    world = len(order)
    if world < 2:
        return ()
    links = ring_links(topology, order)
    shared = links.transfer_us(topology.cost_model.message_bytes)
    return tuple(
        Hop(
            position=position,
            src=order[position],
            dst=order[(position + 1) % world],
            link_class=links.labels[position],
            cost_us=float(cost[order[position], order[(position + 1) % world]]),
            share=int(links.shares[position]),
            shared_us=float(shared[position]),
        )
        for position in range(world)
    )


def step_us(topology: Topology, order: Sequence[int]) -> float:
    """Communication per ring step of ``order`` at the topology's reference message: its slowest hop with NIC
    sharing (ringbench.topology.linkmodel), what emulated links inject and the simulator prices."""
    return ring_links(topology, order).step_us(topology.cost_model.message_bytes)


def _worst_class(topology: Topology, hops: tuple[Hop, ...]) -> str | None:
    if not hops:
        return None
    worst = max(hop.cost_us for hop in hops)
    tied = [hop for hop in hops if hop.cost_us >= worst * (1 - 1e-12)]
    # Equal cost, different classes (possible with measured links): name the worse class.
    return max(tied, key=lambda hop: topology.link(hop.src, hop.dst).badness).link_class


def every_order_equivalent(cost: np.ndarray) -> bool:
    """True when every ring has the same hops' costs: all pairs equal, or so few devices there is one ring."""
    world = cost.shape[0]
    if world <= 2:
        return True
    off_diagonal = cost[~np.eye(world, dtype=bool)]
    if np.allclose(off_diagonal, off_diagonal[0], rtol=1e-12, atol=0):
        return True
    return world == 3 and bool(np.allclose(cost, cost.T, rtol=1e-12, atol=0))  # one ring, two directions


def _equivalence_reason(topology: Topology) -> str:
    world = topology.world
    if world == 1:
        return "a single device: the ring has no hops"
    if world == 2:
        return "two devices: there is only one ring"
    classes = sorted(topology.class_counts())
    if len(classes) == 1:
        return f"every pair is {classes[0]} at the same cost"
    if world == 3:
        return "three devices with symmetric costs: one ring, in either direction"
    return "every pair has the same cost"


def _cuda_visible_devices(topology: Topology, order: list[int]) -> tuple[tuple[tuple[str, str], ...], bool]:
    """Each host's local indices in the order the ring visits them, and whether that alone reproduces the ring.

    With ranks assigned host by host (torchrun: rank = node_rank * nproc + local_rank), an identity ring visits the
    hosts in rank order, each as one run; so remapping GPUs per host reproduces the ring exactly when the recommended
    ring, read from the right start, also visits each host once, in rank order.
    """
    hosts = topology.hosts
    visits = {host: [] for host in hosts}
    world = len(order)
    first_of_host0 = 0
    for position, rank in enumerate(order):  # start reading where the ring enters host 0
        previous = order[(position - 1) % world]
        if topology.devices[rank].host == hosts[0] and topology.devices[previous].host != hosts[0]:
            first_of_host0 = position
            break
    reading = order[first_of_host0:] + order[:first_of_host0]
    for rank in reading:
        visits[topology.devices[rank].host].append(topology.devices[rank].local_index)
    sequence = [topology.devices[rank].host for rank in reading]
    runs = [host for index, host in enumerate(sequence) if index == 0 or sequence[index - 1] != host]
    ranks_in_host_order = [device.host for device in topology.devices] == sorted(
        (device.host for device in topology.devices), key=hosts.index
    )
    exact = runs == list(hosts) and ranks_in_host_order
    return tuple((host, ",".join(str(index) for index in visits[host])) for host in hosts), exact


def recommend(
    topology: Topology,
    current_order: Sequence[int] | str | None = None,
    *,
    exact_limit: int = DEFAULT_EXACT_LIMIT,
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
) -> Recommendation:
    """The lexicographically best ring (worst hop, then total) for ``topology``, compared with ``current_order``.

    ``current_order``: ranks in ring order, or an ORDER string (identity, reverse, stride:K, random:SEED, 0-3-1-2);
    None means identity. Exact up to ``exact_limit`` devices (at most 16); hierarchical search beyond it.
    """
    started = time.perf_counter()
    if not isinstance(exact_limit, int) or not 1 <= exact_limit <= MAX_EXACT:
        raise bad_value("exact_limit", exact_limit, f"an integer in 1..{MAX_EXACT}")
    current = _current(current_order, topology.world)
    cost = topology.cost_matrix()
    all_equivalent = every_order_equivalent(cost)
    if all_equivalent:
        found, method, exact = list(current), "all orders equivalent", True
    else:
        remaining = max(time_budget_s - (time.perf_counter() - started), 0.1)  # the budget covers the whole call
        found, method, exact = _search(topology, cost, exact_limit, remaining)
    order, current_is_optimal = _settle(topology, cost, current, found)
    current_worst, current_total = _worst_and_total(cost, current)
    worst, total = _worst_and_total(cost, order)
    current_step, found_step = step_us(topology, current), step_us(topology, order)
    hops, current_hops = _hops(topology, cost, order), _hops(topology, cost, current)
    visible, visible_exact = _cuda_visible_devices(topology, order)
    return Recommendation(
        order=tuple(order),
        current_order=tuple(current),
        hops=hops,
        current_hops=current_hops,
        worst_hop_class=_worst_class(topology, hops),
        current_worst_hop_class=_worst_class(topology, current_hops),
        worst_hop_us=worst,
        current_worst_hop_us=current_worst,
        total_us=total,
        current_total_us=current_total,
        step_us=found_step,
        current_step_us=current_step,
        predicted_speedup=current_step / found_step if found_step > 0 else 1.0,
        model=topology.cost_model.describe(set(topology.class_counts())),
        message_bytes=topology.cost_model.message_bytes,
        all_equivalent=all_equivalent,
        equivalence_reason=_equivalence_reason(topology) if all_equivalent else "",
        current_is_optimal=current_is_optimal,
        exact=exact,
        method=method,
        elapsed_s=time.perf_counter() - started,
        cuda_visible_devices=visible,
        cuda_visible_devices_exact=visible_exact,
    )


def _current(current_order: Sequence[int] | str | None, world: int) -> list[int]:
    """``recommend``'s ``current_order`` as ranks in ring order (None: identity); a bad spec's error reads
    ``order: order='0-1' is not a permutation ..``: the option's name, then the parser's line (ringbench.orders, the
    parser ``run --order`` uses, so ``recommend --order random:7`` names the same ring)."""
    if isinstance(current_order, str):
        try:
            return parse_order(current_order, world)
        except (UsageError, TypeError, ValueError) as exc:
            raise UsageError(f"order: {exc}") from None
    if current_order is None:
        return list(range(world))
    return validate_ring(current_order, world, "current_order")


def _search(topology: Topology, cost: np.ndarray, exact_limit: int, time_budget_s: float
            ) -> tuple[list[int], str, bool]:  # fmt: skip
    """The best ring the search finds, how it was found, and whether it is provably optimal: exact up to
    ``exact_limit`` devices, hierarchical + local search within ``time_budget_s`` beyond."""
    world = topology.world
    if world <= exact_limit:
        return solve_exact(cost)[2], f"exact (Held-Karp, {world} devices)", True
    host_index = {host: index for index, host in enumerate(topology.hosts)}
    host_of = [host_index[device.host] for device in topology.devices]
    order = hierarchical(cost, host_of, exact_limit, time_budget_s)
    hosts = len(topology.hosts)
    return order, f"hierarchical + local search ({world} devices, {hosts} host{'s' * (hosts != 1)})", False


def _worst_and_total(cost: np.ndarray, ring: Sequence[int]) -> tuple[float, float]:
    """The optimizer's objective: the ring's worst hop, then its total (us)."""
    hops = cost[ring, np.roll(ring, -1)] if len(ring) > 1 else np.zeros(1)
    return float(hops.max()), float(hops.sum())


def _settle(topology: Topology, cost: np.ndarray, current: list[int], found: list[int]) -> tuple[list[int], bool]:
    """The ring to recommend (read from rank 0) given the one ``found``, and whether ``current`` is as good."""
    world = topology.world
    tolerance = 1e-9 * max(float(cost.max()), 1e-12)
    worst, total = _worst_and_total(cost, found)

    def as_good(ring: list[int]) -> bool:
        ring_worst, ring_total = _worst_and_total(cost, ring)
        return ring_worst <= worst + tolerance and ring_total <= total + tolerance

    # Among equally good rings prefer, in turn, the current one (no churn in the launch configuration), then the
    # identity and its reverse (the simplest to read), then the one found.
    order = found
    for candidate in (current, list(range(world)), [0, *range(world - 1, 0, -1)]):
        if as_good(candidate):
            order = list(candidate)
            break
    # The optimizer ranks hops alone; the step shares NICs. A ring slower per step than the current one once sharing
    # is priced is no recommendation: keep the current one.
    if step_us(topology, current) < step_us(topology, order) * (1 - 1e-9):
        order = list(current)
    current_is_optimal = as_good(current) or order == list(current)
    return rotate_to_zero(order), current_is_optimal
