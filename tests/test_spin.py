"""The busy-wait behind emulated pads and link delays on a GPU (ringbench.kernels.spin), driven on the CPU.

The clock a pad counts is chosen at calibration: the nanosecond timer when its kernel runs and measures right
against events, else SM cycles, whose rate the emulated kernel corrects from the pads it measured (clocks that drop
under load would otherwise stretch every pad). Device calls are stood in for; the timer kernel itself is compiled
for an H100 (sm_90) on the CPU, which Triton can do without a GPU.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from ringbench.kernels import emulated, spin

CUDA = torch.device("cuda", 0)


@pytest.fixture
def device_calls(monkeypatch):
    """torch.cuda's device calls on the CPU: _sleep records its cycles; events time what was enqueued at a clock
    of ``calls['ghz']`` GHz (a cycle spin) or exactly (the nanosecond spin)."""
    calls = {"sleep": [], "timer": [], "ghz": 1.98, "timer_ratio": 1.0, "timer_error": None}
    monkeypatch.setattr(spin, "_DEVICES", {})
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls["sleep"].append(cycles), raising=False)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(spin, "timer_problem", lambda: None)

    def event_ms(launch, index):
        before = (list(calls["sleep"]), list(calls["timer"]))
        launch()
        slept = calls["sleep"][len(before[0]) :]
        timed = calls["timer"][len(before[1]) :]
        return sum(slept) / (calls["ghz"] * 1e6) + sum(timed) / 1e6 * calls["timer_ratio"]

    def timer_launch(duration_ns):
        if calls["timer_error"]:
            raise calls["timer_error"]
        calls["timer"].append(duration_ns)

    monkeypatch.setattr(spin, "_event_ms", event_ms)
    from ringbench.kernels import spin_timer

    monkeypatch.setattr(spin_timer, "launch", timer_launch)
    return calls


def test_pads_count_nanoseconds_where_the_timer_spin_measures_right(device_calls):
    rate = spin.calibrate(CUDA)
    assert rate == pytest.approx(1.98e6) and spin.clock(CUDA) == spin.GLOBALTIMER
    assert spin.spin(0.003, CUDA) == 0 and device_calls["timer"][-1] == 3_000_000  # nanoseconds, not cycles
    assert spin.status(CUDA) == {"spin_clock": "globaltimer", "spin_cycles_per_ms": 1_980_000}


@pytest.mark.parametrize(
    ("problem", "ratio", "error", "why"),
    [
        ("Triton is not installed", 1.0, None, "Triton is not installed"),
        (None, 1.0, RuntimeError("ptxas fatal: unknown register %globaltimer"),
         "the nanosecond spin did not run (RuntimeError: ptxas fatal: unknown register %globaltimer)"),
        (None, 1.3, None, "the nanosecond spin measured 1.300 times its duration by CUDA events (allowed 0.98-1.05)"),
    ],
)  # fmt: skip
def test_without_a_working_timer_spin_pads_count_sm_cycles_and_say_why(device_calls, monkeypatch, problem, ratio,
                                                                       error, why):  # fmt: skip
    monkeypatch.setattr(spin, "timer_problem", lambda: problem)
    device_calls["timer_ratio"], device_calls["timer_error"] = ratio, error
    spin.calibrate(CUDA)
    assert spin.clock(CUDA) == spin.SM_CYCLES and spin.status(CUDA)["spin_timer_unused"] == why
    assert spin.spin(0.002, CUDA) == device_calls["sleep"][-1] == round(0.002 * 1.98e9)


def test_the_cycle_rate_follows_the_clock_the_pads_ran_at(device_calls, monkeypatch):
    """Calibrated at an idle 1.98 GHz; under load the SM clock drops to 1.65 GHz: the first iteration's pads run 20%
    long, the emulated kernel measures them, and from the next iteration on they last what they were asked for."""
    monkeypatch.setattr(spin, "timer_problem", lambda: "Triton is not installed")
    spin.calibrate(CUDA)
    device_calls["ghz"] = 1.65
    pacer = _pacer_with_fake_events(monkeypatch, device_calls)
    block_ms = []
    for _ in range(3):
        begun = pacer.begin(CUDA)
        pacer.pad_to(CUDA, "block", begun, 0.010)  # 10 ms modelled, 0.4 ms of it real arithmetic
        pacer.settle()
        block_ms.append(pacer.last_block_ms)
    assert block_ms[0] == pytest.approx(0.4 + 10.0 * 1.98 / 1.65)  # at the idle rate (and no estimate yet): 24% long
    assert block_ms[1] == pytest.approx(10.0, rel=1e-3) and block_ms[2] == pytest.approx(10.0, rel=1e-3)
    assert spin.cycles_per_ms(CUDA) == pytest.approx(1.65e6)
    assert spin.status(CUDA)["spin_cycles_per_ms_corrected"] == 1_650_000
    assert spin.status(CUDA)["spin_cycles_per_ms"] == 1_980_000  # the start-up rate stays on record


def test_short_pads_do_not_correct_the_rate(device_calls, monkeypatch):
    monkeypatch.setattr(spin, "timer_problem", lambda: "Triton is not installed")
    spin.calibrate(CUDA)
    assert spin.correct(CUDA, [(1000, 0.0005), (0, 3.0)]) is None and spin.cycles_per_ms(CUDA) == pytest.approx(1.98e6)
    assert spin.correct(CUDA, [(3_300_000, 2.0), (1_650_000, 1.0), (9_900_000, 5.0)]) == pytest.approx(1.65e6)


def _pacer_with_fake_events(monkeypatch, calls):
    """A Pacer whose events stamp a device clock that advances by what was enqueued (0.4 ms of arithmetic per
    block, then the pad at the fake clock); ``last_block_ms``: the last settled block, begin to end of its pad."""
    now = {"ms": 0.0}

    class Event:
        def __init__(self, enable_timing=False):
            self.ms = None

        def record(self, stream=None):
            self.ms = now["ms"]

        def elapsed_time(self, other):
            return other.ms - self.ms

    real_spin = emulated.spin

    def spin_and_advance(seconds, device, stream=None):
        before = (len(calls["sleep"]), len(calls["timer"]))
        cycles = real_spin(seconds, device, stream)
        now["ms"] += sum(calls["sleep"][before[0] :]) / (calls["ghz"] * 1e6)
        return cycles

    class Pacer(emulated.Pacer):
        last_block_ms = None

        def begin(self, device):
            event = super().begin(device)
            now["ms"] += 0.4  # the block's arithmetic
            return event

        def settle(self):
            _, begun, done, _, _, padded = self._pending[-1]
            self.last_block_ms = begun.elapsed_time(padded if padded is not None else done)
            super().settle()

    monkeypatch.setattr(emulated.torch.cuda, "Event", Event)
    monkeypatch.setattr(emulated, "spin", spin_and_advance)
    return Pacer()


def test_the_timer_spin_is_one_variant_for_every_duration():
    """Triton would compile an int equal to 1, or divisible by 16, a variant of its own: a pad's first launch
    inside a timed iteration would then be a compile."""
    pytest.importorskip("triton")
    from triton.backends.compiler import BaseBackend
    from triton.runtime import jit

    from ringbench.kernels import spin_timer

    kernel = spin_timer._globaltimer_spin_kernel
    compiled = kernel if isinstance(kernel, jit.JITFunction) else jit.JITFunction(kernel.fn, **kernel.kwargs)
    (param,) = compiled.params
    assert param.do_not_specialize
    keys = {jit.native_specialize_impl(BaseBackend, value, False, False, True) for value in (1, 16, 5_000_000,
                                                                                            spin_timer.MAX_LAUNCH_NS)}  # fmt: skip
    assert len(keys) == 1, keys


def test_the_timer_spin_compiles_for_an_h100_and_reads_the_nanosecond_clock_in_its_loop():
    """Triton compiles for a GPU target without one: the PTX for sm_90 reads %globaltimer before and inside the
    loop (an asm the compiler took for pure would be hoisted out, and the kernel would spin forever or not at
    all)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime import jit

    from ringbench.kernels import spin_timer

    kernel = spin_timer._globaltimer_spin_kernel
    compiled = kernel if isinstance(kernel, jit.JITFunction) else jit.JITFunction(kernel.fn, **kernel.kwargs)
    source = ASTSource(fn=compiled, signature={"duration_ns": "i32"}, constexprs={}, attrs={})
    binary = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
    ptx = binary.asm["ptx"]
    body = ptx[ptx.index("Inner Loop Header") :]
    assert ptx.count("%globaltimer") == 2 and "%globaltimer" in body and "bra" in body
    assert binary.metadata.shared == 0 and binary.asm["cubin"]
