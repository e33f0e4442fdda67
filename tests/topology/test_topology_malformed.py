"""Every malformed recording: one clear typed error (or warning) naming the host and the command."""

from __future__ import annotations

import pytest

from tb_fixtures import FIXTURES, MALFORMED, expected
from mlx_jupyter.topology import DiscoveryError, PlanError, Topology

# case -> where the problem surfaces: "discovery" (building the topology fails),
# "warning" (skipped with a warning), "jaccl" (RDMA plans refuse), "ignored" (harmless)
SURFACES = {
    "empty-system-profiler": "discovery",
    "not-json-ssh-error": "discovery",
    "not-json-sudo-error": "discovery",
    "truncated-json": "discovery",
    "missing-spthunderboltdatatype": "discovery",
    "empty-bus-list": "discovery",
    "networksetup-empty": "discovery",
    "networksetup-no-thunderbolt-ports": "discovery",
    "ssh-unreachable": "discovery",
    "bus-without-receptacle-tag": "warning",
    "ibv-devices-not-found": "jaccl",
    "no-ip-address": "jaccl",
    "bus-without-device-name": "ignored",
}


def test_every_case_is_classified():
    assert sorted(SURFACES) == MALFORMED


def message_for(case: str) -> str:
    """The one message a user sees for this case."""
    folder = FIXTURES / "malformed" / case
    surface = SURFACES[case]
    if surface == "discovery":
        with pytest.raises(DiscoveryError) as info:
            Topology.from_recordings(folder)
        assert info.value.host == expected(f"malformed/{case}")["broken_host"]
        return str(info.value)
    topo = Topology.from_recordings(folder)
    if surface == "warning":
        return "\n".join(topo.warnings)
    if surface == "jaccl":
        with pytest.raises(PlanError) as info:
            topo.hostfile("jaccl")
        return str(info.value)
    return ""


@pytest.mark.parametrize("case", [c for c in MALFORMED if SURFACES.get(c) != "ignored"])
def test_message_names_host_and_command(case):
    message = message_for(case)
    for word in expected(f"malformed/{case}")["must_mention"]:
        assert word in message, (word, message)
    assert "Traceback" not in message


def test_system_profiler_error_quotes_what_came_back():
    msg = message_for("not-json-sudo-error")
    assert "a terminal is required" in msg
    assert "exit 1" in msg
    assert "not complete JSON" in message_for("truncated-json")
    assert "Connection to mac-2 closed" in message_for("empty-system-profiler")


def test_missing_device_name_is_harmless():
    topo = Topology.from_recordings(FIXTURES / "malformed" / "bus-without-device-name")
    assert topo.warnings == []
    assert topo.choose_backend().backend in ("jaccl", "jaccl-ring")


def test_bus_without_receptacle_is_named_in_the_warning():
    topo = Topology.from_recordings(FIXTURES / "malformed" / "bus-without-receptacle-tag")
    assert any("thunderboltusb4_bus_2" in w for w in topo.warnings)
    assert topo.connectivity() == [[0, 1], [1, 0]]


def test_missing_ibv_devices_falls_back_to_ring_and_says_why():
    topo = Topology.from_recordings(FIXTURES / "malformed" / "ibv-devices-not-found")
    chosen = topo.choose_backend()
    assert chosen.backend == "ring"
    assert "mac-2" in chosen.reason and "ibv_devices" in chosen.reason and "26.2" in chosen.reason
    assert topo.hosts[1].rdma is not None and topo.hosts[1].rdma.state == "absent"


def test_rank0_without_address_never_gets_a_jaccl_hostfile():
    topo = Topology.from_recordings(FIXTURES / "malformed" / "no-ip-address")
    for backend in ("jaccl", "jaccl-ring"):
        with pytest.raises(PlanError, match="mac-1 \\(rank 0, the coordinator\\)"):
            topo.hostfile(backend)
    chosen = topo.choose_backend()
    assert chosen.backend == "ring"
    assert "mac-1" in chosen.reason


def test_same_mac_under_two_names(tmp_path):
    import shutil

    src = FIXTURES / "two-macs-one-cable"
    shutil.copytree(src, tmp_path / "case")
    shutil.copytree(src / "mini-1", tmp_path / "case" / "mini-1.local")
    with pytest.raises(Exception) as info:
        Topology.from_recordings(tmp_path / "case", ["mini-1", "mini-2", "mini-1.local"])
    assert "mini-1" in str(info.value) and "mini-1.local" in str(info.value)
    assert "same machine" in str(info.value)
