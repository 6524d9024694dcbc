"""The run layer's collectives put every tensor on the group's device, and nothing else in the run layer calls
torch.distributed directly.

An NCCL group refuses CPU tensors, which no CPU run can show. Two checks make that class of bug impossible to
miss on CPU: ``GroupOps`` is driven with a recording ``dist`` stand-in on another device than the CPU (``meta``)
and every tensor it hands the backend must be on that device; and a real run goes through a process-group guard
that refuses any torch.distributed call made from outside the modules allowed to talk to the backend.
"""

import inspect
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from ringbench.rank.collectives import GroupOps
from ringbench.rank.runner import RunSettings, rank_worker
from ringbench.run.launch import launch_local
from ringbench.scenario.scenario import Scenario


class _RecordingDist:
    """Just enough of torch.distributed: records the device of every tensor handed to a collective."""

    ReduceOp = SimpleNamespace(MIN="min", MAX="max", SUM="sum")

    def __init__(self) -> None:
        self.devices: list[torch.device] = []
        self.groups: list[object] = []
        self.made: list[dict] = []

    def get_rank(self, group=None):
        return 0

    def get_world_size(self, group=None):
        return 2

    def get_backend(self, group=None):
        return "nccl"

    def new_group(self, **kwargs):
        self.made.append(kwargs)
        return "side" if "timeout" not in kwargs or kwargs["timeout"] is None else f"patient-{len(self.made)}"

    def all_reduce(self, tensor, op=None, group=None):
        self.devices.append(tensor.device)
        self.groups.append(group)

    def all_gather_object(self, out, obj, group=None):
        assert group == "side", "objects must travel over the CPU side group"
        out[:] = [obj] * len(out)

    def gather_object(self, obj, out, dst=0, group=None):
        assert group == "side"
        if out is not None:
            out[:] = [obj] * len(out)


def test_group_ops_hand_the_backend_tensors_on_the_group_device_only():
    fake = _RecordingDist()
    ops = GroupOps(torch.device("meta"), dist=fake)
    ops.barrier()
    ops.all_objects("host")
    ops.gather_objects({"rows": []})
    with pytest.raises((NotImplementedError, RuntimeError)):  # meta tensors hold no value to read back
        ops.min_int(5)
    assert fake.devices and all(device.type == "meta" for device in fake.devices)


def test_reductions_after_uneven_work_go_over_a_patient_gloo_group_on_the_cpu():
    fake = _RecordingDist()
    ops = GroupOps(torch.device("meta"), dist=fake)  # the group's device: an NCCL group's would be CUDA
    assert ops.min_int_after(7, 300.0) == 7
    assert ops.min_int_after(3, 999.0) == 3  # made once: the same group again
    assert fake.devices == [torch.device("cpu")] * 2 and fake.groups == ["patient-1"] * 2
    assert fake.made == [{"backend": "gloo", "timeout": timedelta(seconds=300.0)}]


def _no_main_group_reduction_after_the_check(worker_ctx, case, settings):
    """run_case on a rank whose main-group collectives refuse to run once the float64 check has begun."""
    import ringbench.engine.reference as reference
    import ringbench.rank.runner as runner

    session = runner.open_session(worker_ctx.env)
    checking = []
    real_check = reference.check_errors

    def check(*args, **kwargs):
        checking.append(True)
        return real_check(*args, **kwargs)

    def refusing(name):
        real = getattr(session.ops, name)

        def call(*args):
            if checking:
                raise RuntimeError(f"GroupOps.{name} on the main group after the float64 check")
            return real(*args)

        return call

    reference.check_errors = check  # the runner's layers import it at call time
    for name in ("barrier", "min_int", "min_float", "max_float"):
        setattr(session.ops, name, refusing(name))
    result = runner.run_case(case, session=session, progress=None, settings=settings, case_index=0, repeat=0)
    return result.fwd_err, len(result.rows)


def test_the_runner_reduces_nothing_on_the_main_group_after_the_check():
    scenario = Scenario(world=(1,), seq=(64,), heads=(1,), head_dim=(8,), iters=2, warmup=0)
    (case,) = scenario.cases()
    ((fwd_err, rows),) = launch_local(1, _no_main_group_reduction_after_the_check,
                                      (case, RunSettings.of(scenario)), timeout_s=60)  # fmt: skip
    assert fwd_err < 1e-5 and rows > 0


_ALLOWED = ("ringbench.engine.comm", "ringbench.engine.ring", "ringbench.rank.collectives", "ringbench.rank.clock")
# isend / irecv are left alone: batch_isend_irecv checks its ops against those very functions.
_GUARDED = ("all_reduce", "all_gather", "broadcast", "reduce", "gather", "scatter", "barrier", "batch_isend_irecv",
            "send", "recv", "all_gather_object", "gather_object", "broadcast_object_list")  # fmt: skip


def _caller_module() -> str:
    for frame in inspect.stack()[2:]:
        name = frame.frame.f_globals.get("__name__", "")
        if not name.startswith("torch"):
            return name
    return "?"


def _install_guard() -> tuple[list[str], dict]:
    """Wrap torch.distributed's calls so that a caller outside the allowed modules is refused and noted."""
    violations, originals = [], {}
    for name in _GUARDED:
        original = originals[name] = getattr(dist, name)

        def guard(*a, __original=original, __name=name, **kw):
            caller = _caller_module()
            if not caller.startswith(_ALLOWED):
                violations.append(f"{caller} called torch.distributed.{__name}")
                raise RuntimeError(f"{caller} called torch.distributed.{__name} directly")
            return __original(*a, **kw)

        setattr(dist, name, guard)
    return violations, originals


def _guarded_worker(worker_ctx, *args):
    """A rank whose torch.distributed refuses calls from outside the modules allowed to talk to the backend."""
    violations, _ = _install_guard()
    result = rank_worker(worker_ctx, *args)
    assert not violations, violations
    return result


def test_a_real_run_makes_every_collective_through_the_allowed_modules():
    scenario = Scenario(world=(2,), seq=(64,), heads=(1,), head_dim=(8,), buffer=("double", "allgather"), iters=2,
                        warmup=1)  # fmt: skip
    cases = list(enumerate(scenario.cases()))
    settings = RunSettings.of(scenario)
    items = []
    launch_local(2, _guarded_worker, (cases, settings, 0), timeout_s=60,
                 on_item=lambda rank, item: items.append(item) or True)  # fmt: skip
    assert len(items) == 2 * len(cases)
    assert all(item.rows for item in items)


def test_the_guard_refuses_a_direct_call():
    violations, originals = _install_guard()
    try:
        with pytest.raises(RuntimeError, match=r"called torch\.distributed\.all_reduce directly"):
            dist.all_reduce(torch.zeros(1))
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
    assert violations == [f"{__name__} called torch.distributed.all_reduce"]
