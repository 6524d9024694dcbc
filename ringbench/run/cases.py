"""The cases a run runs, and what stands around them: the checks made before anything starts, the cases another
implementation can run here, profiler captures, and the ranks' reports as the record takes them (shared by local
and launched runs).
"""

from __future__ import annotations

import dataclasses

from ringbench.errors import UsageError
from ringbench.rank.runner import RunSettings
from ringbench.run.results import ResultsFolder
from ringbench.scenario.scenario import Case, Scenario


def preflight(scenario: Scenario, *, device: str | None = None, loopback: bool = False, trace: bool = True,
              launched=None) -> RunSettings:  # fmt: skip
    """Every check a run makes before it starts anything (UsageError, one line): the scenario, the device, the
    loopback's world, GPUs enough for the ranks, the faults a run can inject. The CLI calls it before it prints
    anything, and ``execute`` again (a library caller may not have)."""
    from ringbench.errors import bad_value
    from ringbench.rank.dist import gpu_shortage, local_gpu_count

    scenario.validate()
    if device not in (None, "cpu", "cuda"):
        raise bad_value("device", device, "cpu or cuda")
    if loopback and any(world != 1 for world in scenario.world):
        raise UsageError(f"loopback=True is not allowed with world={list(scenario.world)}; expected world 1")
    if launched is None and device == "cuda" and local_gpu_count() < max(scenario.world):
        raise gpu_shortage(max(scenario.world), local_gpu_count())  # before spawning anything
    return RunSettings.of(scenario, trace=trace, loopback=loopback)


def runnable(cases: list[Case], device: str | None, launched) -> tuple[list[Case], dict[str, str]]:
    """Cases another implementation cannot run here (not installed, CUDA only, a layout it does not take) are
    skipped with their reason, not failed: a sweep of implementations runs what this machine can."""
    from ringbench.errors import UsageError
    from ringbench.rank.dist import local_gpu_count
    from ringbench.rank.impls import get_adapter

    keep, skipped = [], {}
    for case in cases:
        if case.impl == "ringbench":
            keep.append(case)
            continue
        on_gpu = device == "cuda" or (device is None and local_gpu_count() >= (launched[1] if launched else case.world))
        try:
            get_adapter(case.impl).check(case, "cuda" if on_gpu else "cpu")
        except UsageError as exc:
            skipped[case.case_id] = str(exc)
            continue
        keep.append(case)
    return keep, skipped


def with_profile(settings: RunSettings, folder: ResultsFolder, profile: bool, cases: list[Case]) -> RunSettings:
    """Profiler captures: every case with --profile; another implementation's cases whenever tracing (their
    per-step spans come from the capture)."""
    others = settings.trace and any(case.impl != "ringbench" for case in cases)
    if not (profile or others):
        return settings
    folder.meta["profile"] = {"dir": "profile", "iteration": settings.iters - 1}  # ringbench's: the last timed one
    return dataclasses.replace(settings, profile_dir=str(folder.run_dir / "profile"), profile=profile)


def reported(case: Case, per_rank: list[dict], repeat: int, folder: ResultsFolder) -> list[dict]:
    """The ranks' reports as the record takes them: another implementation's spans come from its captures. When
    its captures cannot be read as a ring, the case keeps the iteration times its ranks measured, with a note."""
    if case.impl == "ringbench":
        return per_rank
    from ringbench.errors import UsageError
    from ringbench.rank.impls import get_adapter
    from ringbench.traces.captures import with_profile_rows

    try:
        patterns = get_adapter(case.impl).compute_patterns
        return with_profile_rows(per_rank, case.case_id, repeat, compute_patterns=patterns)
    except UsageError as exc:
        folder.notes.append(f"{case.case_id}: no per-step spans (iteration times only): {exc}")
        return per_rank
