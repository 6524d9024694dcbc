"""The placement section of reports: ring hops against the topology, flagged slow hops, the recommended order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.given import SimConfig, simulate_run, write_simulated_run
from typer.testing import CliRunner

from ringbench.analysis.hops_on_topology import placement, shared_hop_costs
from ringbench.cli.app import app
from ringbench.report.hops_on_topology import TITLE, placement_section
from ringbench.report.html import render_section as section_html
from ringbench.report.markdown import render_section as section_markdown
from ringbench.topology import load_topology

DATA = Path(__file__).parent / "data" / "topology"
TWO_HOSTS = load_topology(DATA / "two_host_slow_net.yaml")  # node0: ranks 0, 1; node1: ranks 2, 3
HOSTS = [device.host for device in TWO_HOSTS.devices]


def _config(order: tuple[int, ...], case_id: str, **extra) -> SimConfig:
    """A simulated case whose links cost what the topology says: 5 ms between hosts, 0.3 ms inside one."""
    hops = {(order[p], order[(p + 1) % 4]): 0.3 if HOSTS[order[p]] == HOSTS[order[(p + 1) % 4]] else 5.0
            for p in range(4)}  # fmt: skip
    return SimConfig.of(
        world=4, order=order, link_ms_by_hop=hops, case_id=case_id, iterations=3, backward=False, **extra
    )


def _run(*configs, topology=TWO_HOSTS):
    run = simulate_run(list(configs))
    run.meta["topology"] = topology.to_dict()
    return run


def test_stride_two_hops_are_flagged_and_the_recommended_ring_is_not():
    result = placement(_run(_config((0, 1, 2, 3), "identity"), _config((0, 2, 1, 3), "stride2")))
    assert result.recommended == "0-1-2-3" and result.recommended_classes == {"NET": 2, "NV4": 2}
    identity, stride = result.cases
    assert [hop.link_class for hop in identity.hops] == ["NV4", "NET", "NV4", "NET"]
    assert not identity.flagged
    assert [hop.link_class for hop in stride.hops] == ["NET"] * 4
    assert all(hop.avoidable and hop.share == 2 for hop in stride.hops)
    assert stride.predicted_speedup == pytest.approx(2.0, rel=0.01)  # two NET hops share each host pair's link
    assert stride.hops[0].transfer_ms == pytest.approx(5.0, rel=0.01)  # measured, from the events' recv/send rows


def test_a_slow_link_is_a_measured_outlier_of_its_class():
    result = placement(_run(_config((0, 1, 2, 3), "identity", slow_link=(0, 1), slow_link_extra_ms=3.0)))
    (case,) = result.cases
    flagged = case.flagged
    assert [(hop.src, hop.dst) for hop in flagged] == [(0, 1)]
    assert flagged[0].outlier and not flagged[0].avoidable and flagged[0].outlier_ratio > 5


def test_section_is_escaped_html_and_markdown():
    hostile = TWO_HOSTS.__class__(
        devices=TWO_HOSTS.devices, links=TWO_HOSTS.links, cost_model=TWO_HOSTS.cost_model,
        source="<script>alert(1)</script>",
    )  # fmt: skip
    run = _run(_config((0, 2, 1, 3), "stride<b>|2"), topology=hostile)
    section = placement_section(run)
    html_text, markdown = section_html(section), "\n".join(section_markdown(section))
    assert section.title == TITLE
    assert "<script>" not in html_text and "&lt;script&gt;" in html_text
    assert "<b>" not in html_text and "stride&lt;b&gt;" in html_text
    assert "avoidable class" in html_text and "0-1-2-3" in html_text
    assert "stride<b>\\|2" in markdown and "| 0 | 0→2 | NET |" in markdown


def test_no_topology_no_section_and_a_bad_one_is_a_note():
    run = simulate_run(_config((0, 1, 2, 3), "identity"))
    assert placement_section(run) is None
    run.meta["topology"] = {"devices": "nope"}
    section = placement_section(run)
    html_text, markdown = section_html(section), "\n".join(section_markdown(section))
    assert "could not be read" in html_text and "could not be read" in markdown


def test_shared_hop_costs_divide_a_host_pairs_bandwidth():
    shares, costs = shared_hop_costs(TWO_HOSTS, [0, 2, 1, 3])
    alone_shares, alone = shared_hop_costs(TWO_HOSTS, [0, 1, 2, 3])
    assert shares == [2, 2, 2, 2] and alone_shares == [1, 1, 1, 1]
    assert costs[0] == pytest.approx(2 * alone[1] - 2000.0)  # latency 2000 us once, transfer time doubled


def test_report_command_adds_the_placement_section(tmp_path):
    run_dir = write_simulated_run(tmp_path / "sim", [_config((0, 1, 2, 3), "identity"), _config((0, 2, 1, 3), "s2")])
    meta = json.loads((run_dir / "meta.json").read_text())
    (run_dir / "meta.json").write_text(json.dumps({**meta, "topology": TWO_HOSTS.to_dict(), "world": 4}))
    result = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(tmp_path / "reports")])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "reports" / "sim"
    html_text = (folder / "report.html").read_text()
    assert TITLE in html_text and "avoidable class" in html_text
    assert "## Placement" in (folder / "report.md").read_text()
