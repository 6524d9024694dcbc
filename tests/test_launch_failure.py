"""The failure verdict names the cause, not the ranks that failed because of it."""

from types import SimpleNamespace

from ringbench.run.launch import _SLOTS, PHASE_CODES, _failure


def _progress(*where):
    array = []
    for case, phase, iteration, step in where:
        array += [case, PHASE_CODES[phase], iteration, step]
    assert len(array) == _SLOTS * len(where)
    return array


def test_a_silent_rank_is_named_before_ranks_the_backend_aborted_afterwards():
    procs = [SimpleNamespace(exitcode=code) for code in (-6, None, -6)]  # NCCL's watchdog aborted 0 and 2
    progress = _progress((0, "fwd", 0, 2), (0, "fwd", 0, 1), (0, "fwd", 0, 2))
    failure = _failure(procs, {}, {}, progress, ["case-a"])
    assert str(failure).startswith("rank 1 stopped responding at fwd ring step 1")


def test_aborted_ranks_are_named_when_nothing_else_explains_it():
    procs = [SimpleNamespace(exitcode=0), SimpleNamespace(exitcode=-6)]
    failure = _failure(procs, {0: "ok"}, {}, _progress((0, "bwd", 0, 0), (0, "bwd", 0, 3)), ["case-a"])
    assert str(failure).startswith("rank 1 was aborted by the backend at bwd ring step 3")


def test_a_crash_outranks_everything():
    procs = [SimpleNamespace(exitcode=None), SimpleNamespace(exitcode=17), SimpleNamespace(exitcode=-6)]
    failure = _failure(procs, {}, {}, _progress((0, "fwd", 0, 1), (0, "fwd", 0, 1), (0, "fwd", 0, 1)), ["c"])
    assert str(failure).startswith("rank 1 died (exit code 17)")
