"""Topology sources: nvidia-smi text, YAML, measured matrices, NVML (faked and absent), the JSON form."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from ringbench.errors import UsageError
from ringbench.topology import (
    DEFAULT_CLASS_COSTS,
    CostModel,
    DeviceRecord,
    Link,
    LinkKind,
    Topology,
    collect_local_records,
    collect_nvml_topology,
    from_probe_matrix,
    load_topology,
    looks_like_nvidia_smi,
    merge_device_records,
    parse_link_class,
    parse_nvidia_smi,
    parse_yaml_topology,
    read_topology_text,
)

DATA = Path(__file__).parent / "data" / "topology"
FIXTURES = {
    "dgx_a100_nv12.txt": (8, {"NV12"}),
    "hgx_h100_nv18_2socket_vllm22372.txt": (8, {"NV18"}),
    "hgx_h200_nv18.txt": (8, {"NV18"}),
    "pcie8_dual_socket_pix_pxb_sys.txt": (8, {"PIX", "PXB", "SYS"}),
    "perlmutter_a100_4gpu_nv4_mesh.txt": (4, {"NV4"}),
    "4gpu_h100_nv6_mesh.txt": (4, {"NV6"}),
}


# -- links and cost model -------------------------------------------------------------------------------------------


def test_link_classes_parse_and_rank():
    assert parse_link_class("NV12") == (LinkKind.NV, 12)
    assert parse_link_class(" pxb ") == (LinkKind.PXB, 0)
    assert parse_link_class("SOC") == (LinkKind.SYS, 0)  # the old spelling
    order = [Link.of(label).badness for label in ("NV18", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS", "NET")]
    assert order == sorted(order)
    for bad in ("NVX", "NV0", "NV", "FOO", 3):
        with pytest.raises(UsageError, match="class"):
            parse_link_class(bad)


def test_default_costs_rank_classes_like_the_legend():
    model = CostModel()
    labels = ("NV18", "NV12", "NV4", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS", "NET")
    costs = [model.hop_us(Link.of(label)) for label in labels]
    assert costs == sorted(costs)
    assert set(DEFAULT_CLASS_COSTS) == set(LinkKind)
    # 32 MiB over NV12 (12 x 25 GB/s) plus 2 us of latency.
    assert model.hop_us(Link.of("NV12")) == pytest.approx(2.0 + 32 * 2**20 / 300e3)


def test_measured_link_overrides_class_cost_and_errors_name_fields():
    model = CostModel()
    assert model.hop_us(Link.of("SYS", latency_us=1.0, bandwidth_gbps=1000.0)) < model.hop_us(Link.of("NV18"))
    with pytest.raises(UsageError, match="bandwidth_gbps"):
        Link(kind=LinkKind.SYS, bandwidth_gbps=0.0)
    with pytest.raises(UsageError, match="latency_us and bandwidth_gbps"):
        Link(latency_us=3.0)
    with pytest.raises(UsageError, match=r"class_costs\.FOO"):
        model.with_overrides({"FOO": {"latency_us": 1.0}})
    with pytest.raises(UsageError, match="message_bytes"):
        CostModel(message_bytes=0)


# -- nvidia-smi text ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_nvidia_smi_fixtures_parse_gpus_only(name):
    world, classes = FIXTURES[name]
    topology = parse_nvidia_smi((DATA / name).read_text())
    assert topology.world == world
    assert set(topology.class_counts()) == classes  # NIC rows and columns dropped
    matrix = topology.label_matrix()
    assert all(matrix[i][i] == "X" for i in range(world))
    assert matrix == [list(row) for row in zip(*matrix, strict=True)]  # nvidia-smi matrices are symmetric


def test_nvidia_smi_numa_and_local_indices():
    topology = parse_nvidia_smi((DATA / "dgx_a100_nv12.txt").read_text())
    assert [device.numa_node for device in topology.devices] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert [device.local_index for device in topology.devices] == list(range(8))
    pcie = parse_nvidia_smi((DATA / "pcie8_dual_socket_pix_pxb_sys.txt").read_text())
    assert all(device.numa_node is None for device in pcie.devices)  # "N/A" in the file
    assert pcie.label_matrix()[0][1] == "PIX" and pcie.label_matrix()[3][4] == "SYS"


def test_nvidia_smi_variants_ansi_prompt_soc_spaces_no_affinity():
    text = (
        "user@node:~$ nvidia-smi topo -m\n"
        "# a comment\n"
        "\x1b[4m        GPU0    GPU1    GPU2    mlx5_0  CPU Affinity\x1b[0m\n"
        "GPU0     X      NV2     SOC     PIX     0-11,24-35\n"
        "GPU1    NV2      X      SOC     PIX     0-11,24-35\n"
        "GPU2    SOC     SOC      X      SOC     12-23,36-47\n"
        "mlx5_0  PIX     PIX     SOC      X\n"
        "\nLegend:\n\n  X    = Self\n  SOC  = old name of SYS\n"
    )
    assert looks_like_nvidia_smi(text)
    topology = parse_nvidia_smi(text)
    assert topology.label_matrix() == [["X", "NV2", "SYS"], ["NV2", "X", "SYS"], ["SYS", "SYS", "X"]]
    assert all(device.numa_node is None for device in topology.devices)


def test_nvidia_smi_errors_name_the_cell():
    text = "\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tPIX\t X \n"
    with pytest.raises(UsageError, match="GPU0 -> GPU1"):
        parse_nvidia_smi(text)
    with pytest.raises(UsageError, match="no GPU1 row"):
        parse_nvidia_smi("\tGPU0\tGPU1\nGPU0\t X \tPIX\n")
    with pytest.raises(UsageError, match="not an `nvidia-smi topo -m` matrix"):
        parse_nvidia_smi("hello\n")


# -- YAML, measured, JSON form, detection -----------------------------------------------------------------------------


def test_yaml_two_host_cluster_example():
    topology = load_topology(DATA / "two_host_pcie.yaml")
    assert topology.world == 16 and topology.hosts == ("node0", "node1")
    matrix = topology.label_matrix()
    single = parse_nvidia_smi((DATA / "pcie8_dual_socket_pix_pxb_sys.txt").read_text()).label_matrix()
    assert [row[:8] for row in matrix[:8]] == single  # each host is the pcie8 server
    assert [row[8:] for row in matrix[8:]] == single
    assert {matrix[i][j] for i in range(8) for j in range(8, 16)} == {"NET"}
    net = topology.cost_model.class_costs[LinkKind.NET]
    assert (net.latency_us, net.bandwidth_gbps) == (8.0, 12.0)


def test_yaml_matrix_overrides_and_measured_links():
    text = """
hosts:
  - name: a
    matrix: [[X, NV4, PHB], [NV4, X, PHB], [PHB, PHB, X]]
  - {name: b, gpus: 2, intra: NV18}
links:
  - {from: "a:0", to: 3, latency_us: 20.0, bandwidth_gbps: 5.0, one_way: true}
"""
    topology = parse_yaml_topology(text)
    assert topology.world == 5
    assert topology.link(0, 3).kind is LinkKind.NET and topology.link(0, 3).latency_us == 20.0
    assert not topology.link(3, 0).measured  # one_way
    assert topology.label_matrix()[3][4] == "NV18"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[1, 2, 3]", "expected a YAML mapping"),
        ("hosts: [{gpus: 2}]", r"hosts\[0\]\.intra is missing"),
        ("intra: NV8\nhosts: [{gpus: 2, numa: [0]}]", r"hosts\[0\]\.numa"),
        ("intra: FAST\nhosts: [{gpus: 2}]", r"hosts\[0\]\.intra='FAST'"),
        ("intra: PIX\nhosts: [{gpus: 2, cpus: 4}]", r"hosts\[0\]\.cpus"),
        ("intra: PIX\nhosts: [{gpus: 2}]\nlinks: [{from: 0, to: 7, class: SYS}]", r"links\[0\]\.to"),
        ("hosts: [{matrix: [[X, PIX], [PIX]]}]", r"matrix\[1\]"),
        ("hosts: [unclosed", "not valid YAML"),
        ("latency_us: [[0, 1], [1, 0]]\nbandwidth_gbps: [[1, 1, 1]]", "bandwidth_gbps"),
    ],
)
def test_yaml_errors_name_the_field(text, match):
    with pytest.raises(UsageError, match=match):
        parse_yaml_topology(text, source="t.yaml")


def test_probe_matrix_and_measured_yaml():
    topology = from_probe_matrix([[0, 2.0], [3.0, 0]], [[1, 50.0], [40.0, 1]], hosts=["h0", "h1"])
    assert topology.label_matrix() == [["X", "measured"], ["measured", "X"]]
    assert topology.cost_model.latency_bandwidth(topology.link(1, 0)) == (3.0, 40.0)
    assert topology.hosts == ("h0", "h1")
    measured = load_topology(DATA / "measured_asymmetric.yaml")
    costs = measured.cost_matrix()
    assert costs[0, 1] < costs[1, 0]  # asymmetric: direction matters
    with pytest.raises(UsageError, match=r"latency_us\[0\]\[1\]"):
        from_probe_matrix([[0, -1.0], [1.0, 0]], [[1, 1.0], [1.0, 1]])


def test_to_dict_round_trip_keeps_links_costs_and_devices():
    topology = load_topology(DATA / "two_host_pcie.yaml")
    assert Topology.from_dict(topology.to_dict()) == topology
    measured = load_topology(DATA / "measured_asymmetric.yaml")
    assert Topology.from_dict(measured.to_dict()) == measured
    document = topology.to_dict()
    document["links"][0][1] = "WARP"
    with pytest.raises(UsageError, match=r"links\[0\]\[1\]"):
        Topology.from_dict(document)


def test_format_detection():
    nvsmi = read_topology_text((DATA / "hgx_h200_nv18.txt").read_text(), source="h200")
    assert nvsmi.source == "nvidia-smi:h200"
    assert read_topology_text("intra: NV12\nhosts: [{gpus: 4}]").world == 4
    assert read_topology_text('{"topology": ' + __import__("json").dumps(nvsmi.to_dict()) + "}").world == 8
    with pytest.raises(UsageError, match="empty file"):
        read_topology_text("  \n")


# -- NVML ------------------------------------------------------------------------------------------------------------


class FakeNVMLError(Exception):
    pass


def fake_pynvml(nvlinks: dict[tuple[int, int], int], switch_links: int = 0, ancestor: int = 50, count: int = 4):
    """A stand-in for pynvml: GPU i has bus 0000:0i:00.0; links listed per pair, or `switch_links` to an NVSwitch."""
    buses = [f"0000:{index + 1:02x}:00.0".encode() for index in range(count)]
    remotes: dict[int, list[str]] = {index: [] for index in range(count)}
    for (a, b), links in nvlinks.items():
        remotes[a] += [buses[b].decode()] * links
        remotes[b] += [buses[a].decode()] * links
    for index in range(count):
        remotes[index] += ["00000000:ff:00.0"] * switch_links  # the NVSwitch's bus

    def remote_info(handle, link):
        if link >= len(remotes[handle]):
            raise FakeNVMLError("Not Supported")
        return SimpleNamespace(busId=remotes[handle][link])

    return SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVML_FEATURE_ENABLED=1,
        NVML_NVLINK_MAX_LINKS=18,
        NVML_NVLINK_DEVICE_TYPE_SWITCH=2,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetPciInfo=lambda handle: SimpleNamespace(busId=buses[handle]),
        nvmlDeviceGetName=lambda handle: b"NVIDIA Fake",
        nvmlDeviceGetNvLinkState=lambda handle, link: 1 if link < len(remotes[handle]) else 0,
        nvmlDeviceGetNvLinkRemotePciInfo=remote_info,
        nvmlDeviceGetNvLinkRemoteDeviceType=lambda handle, link: 2,
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 20 if a // 2 == b // 2 else ancestor,
        nvmlDeviceGetNumaNodeId=lambda handle: handle // 2,
    )


def test_nvml_parsing_with_a_fake_pynvml():
    nvml = fake_pynvml({(0, 1): 2, (2, 3): 4})
    topology = collect_nvml_topology(nvml, host="box")
    assert topology.label_matrix() == [
        ["X", "NV2", "SYS", "SYS"],
        ["NV2", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "NV4"],
        ["SYS", "SYS", "NV4", "X"],
    ]
    assert [device.numa_node for device in topology.devices] == [0, 0, 1, 1]
    assert topology.devices[0].name == "NVIDIA Fake" and topology.hosts == ("box",)
    no_nvlink = collect_nvml_topology(fake_pynvml({}, ancestor=40), host="box")
    assert no_nvlink.label_matrix()[0][1:] == ["PXB", "NODE", "NODE"]


def test_nvml_nvswitch_boards_are_all_nv():
    topology = collect_nvml_topology(fake_pynvml({}, switch_links=18, count=8), host="hgx")
    assert topology.class_counts() == {"NV18": 56}


def test_nvml_unavailable_returns_none_with_one_logged_line(caplog):
    def broken_init():
        raise FakeNVMLError("NVML Shared Library Not Found")

    nvml = fake_pynvml({})
    nvml.nvmlInit = broken_init
    with caplog.at_level(logging.INFO, logger="ringbench.topology.nvml"):
        assert collect_local_records(nvml) is None
    assert [record.getMessage() for record in caplog.records] == ["NVML unavailable: NVML Shared Library Not Found"]


def test_nvml_on_this_machine_does_not_hang_or_raise():
    # No GPU on CI: the real pynvml fails to load its library and the collector says so (None). On a GPU host this
    # returns the local topology instead; both are fine.
    topology = collect_nvml_topology()
    assert topology is None or topology.world >= 1


def test_merge_records_from_two_hosts():
    records = []
    for host_index, host in enumerate(("h0", "h1")):
        local = collect_local_records(fake_pynvml({(0, 1): 2, (2, 3): 2}), host=host, rank_offset=4 * host_index)
        records += [record.to_dict() for record in local]  # what all_gather_object would carry
    topology = merge_device_records(list(reversed(records)))
    assert topology.world == 8 and topology.hosts == ("h0", "h1")
    matrix = topology.label_matrix()
    assert matrix[0][1] == "NV2" and matrix[4][5] == "NV2" and matrix[0][2] == "SYS"
    assert {matrix[i][j] for i in range(4) for j in range(4, 8)} == {"NET"}
    lonely = DeviceRecord(rank=1, host="h0", local_index=1, bus_id="0000:02:00.0")
    with pytest.raises(UsageError, match="neither record names the link"):
        merge_device_records([DeviceRecord(rank=0, host="h0", local_index=0, bus_id="0000:01:00.0"), lonely])
    with pytest.raises(UsageError, match=r"records\.rank"):
        merge_device_records([lonely])


def test_nvml_records_follow_cuda_visible_devices_numbering():
    # CUDA_VISIBLE_DEVICES=3,1: cuda:0 is NVML's GPU 3 and cuda:1 its GPU 1; the others are not this run's.
    nvml = fake_pynvml({(0, 1): 2, (1, 3): 4})
    nvml.nvmlDeviceGetUUID = lambda handle: f"GPU-{handle:04d}-fake"
    records = collect_local_records(nvml, host="box", visible="3,1")
    assert [(r.rank, r.local_index, r.bus_id[-7:]) for r in records] == [(0, 0, "04:00.0"), (1, 1, "02:00.0")]
    assert records[0].peers == {records[1].bus_id: "NV4"}  # the link between the two visible GPUs only
    by_uuid = collect_local_records(nvml, host="box", visible="GPU-0002,GPU-0000,7,1")  # stops at the bad entry
    assert [r.bus_id[-7:] for r in by_uuid] == ["03:00.0", "01:00.0"]
    assert [r.local_index for r in collect_local_records(nvml, host="box", visible=None)] == [0, 1, 2, 3]
    topology = collect_nvml_topology(nvml, host="box", visible="3,1")
    assert topology.label_matrix() == [["X", "NV4"], ["NV4", "X"]]
