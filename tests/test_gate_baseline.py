"""Baseline files: save, read back, every format version readable, bad files refused with one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.synthetic import lognormal_steps, write_synthetic_run

from ringbench.errors import UsageError
from ringbench.gate.baseline import BASELINE_VERSION, read_baseline, write_baseline
from ringbench.gate.compare import compare, load_sample_set
from ringbench.gate.samples import sample_set_from_run
from ringbench.record.store import load_run

DATA = Path(__file__).parent / "data" / "gate"


def test_round_trip_keeps_samples_axes_and_metadata(tmp_path):
    steps = lognormal_steps(cv=0.02, iterations=7, repeats=3, seed=3)
    run_dir = write_synthetic_run(tmp_path / "run", {"seq": 2048, "faults": "slow:rank=1"}, steps)
    original = sample_set_from_run(load_run(run_dir))
    path = write_baseline(original, tmp_path / "b" / "baseline.json")
    loaded = read_baseline(path)
    assert loaded.kind == "baseline" and loaded.run_id == "run"
    assert loaded.meta["backend"] == "gloo" and loaded.meta["torch_version"] == "2.13.0"
    (case,) = loaded.cases
    assert case.key == original.cases[0].key
    for saved, measured in zip(case.repeats, steps, strict=True):
        np.testing.assert_allclose(saved, measured, atol=1e-6)
    document = json.loads(path.read_text())
    assert document["format_version"] == BASELINE_VERSION
    assert "events" not in document and len(path.read_text().splitlines()) < 30  # compact: one line per case


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("baseline_v*.json")))
def test_every_stored_format_version_still_reads(name):
    samples = read_baseline(DATA / name)
    assert len(samples.cases) == 2 and all(case.n_samples == 10 for case in samples.cases)
    assert samples.meta["device_kind"] == "cpu"


def test_fixture_compares_against_a_run(tmp_path):
    # The v1 fixture: 2 cases (seq 4096 at ~100 ms, seq 8192 with a fault at ~400 ms), 2 repeats x 5 iterations.
    current = write_synthetic_run(
        tmp_path / "run",
        {
            "a": ({"seq": 4096}, lognormal_steps(cv=0.02, iterations=5, repeats=2, seed=5)),
            "b": (
                {"seq": 8192, "faults": "delay:rank=1:ms=2"},
                lognormal_steps(cv=0.02, iterations=5, repeats=2, median_ms=400, seed=6),
            ),
        },
    )
    result = compare(DATA / "baseline_v1.json", current)
    assert len(result.cases) == 2 and not result.only_baseline and not result.only_current


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"format": "other"}', "not a ringbench baseline"),
        ('{"format": "ringbench-baseline", "format_version": 99}', "format_version=99 is not supported"),
        ('{"format": "ringbench-baseline", "format_version": 1, "cases": [{"axes": 3}]}', "case #0 is malformed"),
    ],
)
def test_bad_files_raise_one_line(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as info:
        load_sample_set(path)
    assert "\n" not in str(info.value)


def test_missing_input_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_sample_set(tmp_path / "nope")


def test_emulated_rates_that_differ_are_a_mismatch_and_survive_a_baseline(tmp_path):
    import numpy as np

    from ringbench.gate.baseline import read_baseline, write_baseline
    from ringbench.gate.match import match_cases
    from ringbench.gate.samples import MATCH_FIELDS, CaseSamples, SampleSet

    axes = {name: None for name in MATCH_FIELDS} | {"world": 4, "dtype": "float32", "kernel": "emulated:auto"}

    def side(rate, name):
        case = CaseSamples(axes=axes, emulated=True, case_ids=("c",), repeats=(np.ones(5),), emulated_gflops=rate)
        meta = {"device_kind": "cpu", "backend": "gloo", "torch_version": "2.13.0", "emulated": True}
        return SampleSet(source=name, kind="run", run_id=name, meta=meta, cases=(case,))

    with pytest.raises(UsageError, match=r"emulated rate: 12 GFLOP/s \(baseline\) vs 20 \(current\)"):
        match_cases(side(12.0, "a"), side(20.0, "b"))
    assert match_cases(side(12.0, "a"), side(12.0, "b")).pairs
    saved = read_baseline(write_baseline(side(12.0, "a"), tmp_path / "base.json"))
    assert saved.cases[0].emulated_gflops == 12.0
