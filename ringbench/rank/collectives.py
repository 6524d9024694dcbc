"""Every collective the run layer makes (not the ring's own traffic), with tensors on the right device.

An NCCL group accepts only CUDA tensors: a CPU tensor all-reduced on it raises ("No backend type associated with
device type cpu") after the timed loop, and the case is lost. So the run layer never calls torch.distributed
itself: it calls ``GroupOps``, which puts every tensor on the group's device. Python objects (results, host names)
travel over a gloo *side group* on the CPU, which also carries the clock ping-pong: it costs no GPU memory, and
its timing does not depend on the GPU's queue.

Work whose duration differs by rank -- the float64 check above all, up to its budget per rank -- must not be followed
by a reduction on the main group: on NCCL the group's timeout (ringbench's plus a margin) can expire while the
slowest rank still checks, and NCCL's watchdog then aborts the job. Those reductions go over a *patient* gloo group
(``min_int_after``), made once with a timeout that outlasts the check.

``dist`` is injectable so that a test can verify, without a GPU, that every tensor reaches the backend on the
group's device.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as torch_dist


class GroupOps:
    """Barriers, reductions and object exchange for one process group whose tensors live on ``device``."""

    def __init__(self, device: torch.device, group=None, *, dist=torch_dist, side_group=None) -> None:
        self.device = torch.device(device)
        self.group = group
        self.dist = dist
        self._side = side_group  # gloo group over the same ranks (CPU objects and timing); made on first use
        self._patient = None  # gloo group whose timeout outlasts uneven work (made on first use)

    @property
    def rank(self) -> int:
        return self.dist.get_rank(self.group)

    @property
    def world(self) -> int:
        return self.dist.get_world_size(self.group)

    def side(self):
        """The gloo side group (the group itself when it is already gloo). Collective: every rank calls it."""
        if self._side is None:
            if self.dist.get_backend(self.group) == "gloo":
                self._side = self.group
            else:
                self._side = self.dist.new_group(backend="gloo", timeout=_group_timeout(self.dist, self.group))
        return self._side

    def barrier(self) -> None:
        """Every rank reaches this point (a one-element all-reduce on the group's device, bounded by its timeout)."""
        token = torch.zeros(1, device=self.device)
        self.dist.all_reduce(token, group=self.group)

    def min_int(self, value: int) -> int:
        tensor = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MIN, group=self.group)
        return int(tensor.item())

    def min_float(self, value: float) -> float:
        tensor = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MIN, group=self.group)
        return float(tensor.item())

    def patient(self, timeout_s: float):
        """A gloo group over the same ranks with a timeout of ``timeout_s`` (the first call's), for reductions
        after work of uneven length. Collective on first use: every rank calls it at the same point."""
        if self._patient is None:
            self._patient = self.dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        return self._patient

    def min_int_after(self, value: int, timeout_s: float) -> int:
        """The minimum over ranks after work whose duration differs by rank (the float64 check): over the
        patient gloo group, on the CPU, so neither the main group's timeout nor NCCL's watchdog can cut it."""
        tensor = torch.tensor([int(value)], dtype=torch.int64)  # CPU: the patient group is gloo
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MIN, group=self.patient(timeout_s))
        return int(tensor.item())

    def max_float(self, value: float) -> float:
        tensor = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MAX, group=self.group)
        return float(tensor.item())

    def all_objects(self, obj) -> list:
        """Every rank's ``obj``, in rank order (over the CPU side group)."""
        gathered = [None] * self.world
        self.dist.all_gather_object(gathered, obj, group=self.side())
        return gathered

    def gather_objects(self, obj, dst: int = 0) -> list | None:
        """Every rank's ``obj`` on rank ``dst`` (None elsewhere), over the CPU side group."""
        gathered = [None] * self.world if self.rank == dst else None
        self.dist.gather_object(obj, gathered, dst=dst, group=self.side())
        return gathered


def _group_timeout(dist, group) -> timedelta | None:
    try:
        return dist.distributed_c10d._get_default_timeout(dist.get_backend(group))
    except Exception:  # older/newer torch: the backend default is fine
        return None
