"""Launched across hosts, a rank's profiler capture (``run --impl``: another implementation's per-step spans come
from it) is on its own host's disk: it travels to rank 0 with the rank's rows, or stays with a one-line note."""

from __future__ import annotations

import gzip

from ringbench.rank.rank_report import RankReport
from ringbench.run.launched import land_capture, ship_capture
from ringbench.run.results import ResultsFolder
from ringbench.traces.captures import with_profile_rows


def test_a_capture_on_another_host_travels_with_the_rows_and_lands_in_rank_0s_folder(tmp_path):
    other_host = tmp_path / "other-host-disk"
    other_host.mkdir()
    capture = other_host / "r0-rank1.json.gz"
    capture.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    report = RankReport(case_id="case-a", rank=1, rows=[{"kind": "iteration"}], profile=str(capture))
    shipped = ship_capture(report)
    assert shipped.profile_bytes == gzip.compress(b'{"traceEvents": []}') and not capture.exists()
    folder = ResultsFolder.create(tmp_path / "results", "launched", {"command": "test"})
    landed = land_capture(shipped, folder, "case-a", repeat=0)
    path = folder.run_dir / "profile" / "case-a" / "r0-rank1.json.gz"
    assert landed.profile == str(path) and path.read_bytes() == shipped.profile_bytes
    assert landed.profile_bytes is None and landed.rows == report.rows


def test_a_capture_too_large_to_ship_stays_home_and_the_case_keeps_its_times(tmp_path):
    capture = tmp_path / "big.json.gz"
    capture.write_bytes(b"x" * 4096)
    shipped = ship_capture(RankReport(case_id="case-b", rank=3, profile=str(capture)), limit=1024)
    assert shipped.profile is None and "exceeds" in shipped.profile_note and capture.exists()
    folder = ResultsFolder.create(tmp_path / "results", "launched", {"command": "test"})
    landed = land_capture(shipped, folder, "case-b", repeat=0)
    assert folder.notes == ["case-b: " + shipped.profile_note] and not landed.profile_note
    reports = [RankReport(case_id="case-b", rank=0, rows=[{"kind": "iteration"}], profile="rank0.json.gz"), landed]
    assert with_profile_rows(reports, "case-b", 0) == reports  # not every rank's capture: iteration times only


def test_a_rank_without_a_capture_ships_nothing():
    report = RankReport(case_id="case-c", rank=2)
    assert ship_capture(report) is report
