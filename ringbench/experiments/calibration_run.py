"""``ringbench calibrate``: one short run that measures what the simulator needs, on the machine at hand.

A single case gives the fit one block size per mask kind, one message size, one phase or buffer at best, so a
per-call cost and a rate, or a link's latency and bandwidth, cannot be told apart (identify.py). The calibration
run sweeps exactly what separates them:

  seq      S/2 and S: two block sizes per mask kind (call cost vs rate) and two K/V message sizes (latency vs
           bandwidth; the backward's fp32 dK/dV accumulators add more)
  buffer   sync and double: the host gaps of both
  phases   forward and backward
  mask     causal by default (full and causal blocks); add causal-naive for partial blocks, none for full only

on the kernel, dtype, heads and head dim the user means to predict, at a world that fits the machine (the
device count on GPUs; 2 on a CPU, where more ranks share cores). The run is an ordinary ``ringbench run`` record
(analyze, report and compare read it); its meta.json also keeps the calibration (``calibration``: the costs,
each with its source), and ``ringbench simulate --from RUN_DIR`` uses it.

    scenario = calibration_scenario(world=2, seq=4096, kernel="torch")
    run_dir, calibration = run_calibration(scenario)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ringbench.calibration.calibrate import Calibration, calibrate
from ringbench.errors import bad_value
from ringbench.scenario.scenario import Scenario

DEFAULT_SEQ = 2048


def calibration_scenario(*, world: int = 2, seq: int = DEFAULT_SEQ, heads: int = 2, head_dim: int = 32,
                         batch: int = 1, dtype: str = "float32", kernel: str = "torch",
                         masks: Sequence[str] = ("causal",), layout: str = "contiguous", iters: int = 5,
                         warmup: int = 1, check: bool = False, timeout: float = 60.0, topology: str | None = None,
                         emulate_links: bool = False) -> Scenario:  # fmt: skip
    """The calibration sweep (module docstring): S/2 and S, sync and double, forward and backward."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise bad_value("world", world, "an integer >= 1")
    parts = 2 * world if layout == "zigzag" else world
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 2 * parts or seq % (2 * parts):
        raise bad_value("seq", seq, f"a multiple of {2 * parts} (S/2 must split into {parts} equal parts too)")
    scenario = Scenario(
        name="calibrate", description="ringbench calibrate: two block sizes per mask kind, both phases, both "
        "ring buffers, several message sizes (what the simulator needs to separate its costs)",
        world=(world,), seq=(seq // 2, seq), heads=(heads,), head_dim=(head_dim,), batch=(batch,), dtype=(dtype,),
        mask=tuple(masks), layout=(layout,), buffer=("sync", "double"), order=("identity",), kernel=(kernel,),
        backward=True, iters=iters, warmup=warmup, check=check, timeout=timeout, topology=topology,
        emulate_links=emulate_links,
    )  # fmt: skip
    return scenario.validate()


def run_calibration(scenario: Scenario, *, out: str | Path = "results", command: str = "ringbench calibrate",
                    on_case: Callable[[dict, int, int], None] | None = None,
                    device: str | None = None) -> tuple[Path, Calibration]:  # fmt: skip
    """Run the calibration sweep, fit the simulator's costs on it, and keep them in the run's meta.json."""
    from ringbench.record.folder import RecordFolder
    from ringbench.record.meta import read_meta
    from ringbench.record.store import load_run
    from ringbench.run.sweep import execute

    state = execute(scenario, out=out, command=command, on_case=on_case, device=device)
    if state is None:  # a launched rank other than 0: rank 0 writes
        return Path(), None  # type: ignore[return-value]
    run_dir = Path(state.run_dir)
    calibration = calibrate(load_run(run_dir))
    folder = RecordFolder(run_dir=run_dir, meta=read_meta(run_dir), producer="run")  # the sweep's finished folder
    folder.meta["calibration"] = calibration.to_dict()
    folder.save_meta()
    return run_dir, calibration


__all__ = ["DEFAULT_SEQ", "calibration_scenario", "run_calibration"]
