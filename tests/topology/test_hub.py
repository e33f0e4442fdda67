"""Two Macs behind one Thunderbolt hub (a constructed recording, see hub_recording.py)."""

from __future__ import annotations

import io
import json

import pytest

from fake_runner import FakeRunner, as_run
from hub_recording import HOSTS, two_macs_behind_hub
from mlx_jupyter import configurator
from mlx_jupyter.topology import Cable, CommandResult, End, PlanError, Topology
from mlx_jupyter.topology.system_profiler import parse_system_profiler

HUB = ("Thunderbolt 5 Hub",)


@pytest.fixture
def hub_case(tmp_path):
    return two_macs_behind_hub(tmp_path / "two-macs-behind-hub")


@pytest.fixture
def hub_ring(tmp_path):
    return two_macs_behind_hub(tmp_path / "two-macs-behind-hub-and-cabled", direct=True)


def test_the_upstream_port_reaches_both_macs(hub_case):
    text = (hub_case / "hub-studio" / "system_profiler.json").read_text()
    buses, _ = parse_system_profiler("hub-studio", CommandResult(0, text))
    [bus] = [b for b in buses if b.peers]
    assert [p.name for p in bus.peers] == ["Mac mini", "Mac mini"]
    assert all(p.via == HUB for p in bus.peers) and bus.peer == bus.peers[0]


def test_both_cables_are_kept_without_a_pairing_warning(hub_case):
    topo = Topology.from_recordings(hub_case)
    assert topo.cables == [Cable(End(0, "en2"), End(1, "en2"), 80.0, HUB), Cable(End(0, "en2"), End(2, "en2"), 80.0, HUB)]
    assert topo.connectivity() == [[0, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert not any("already paired" in w for w in topo.warnings)
    assert [w.split(" through ")[0] for w in topo.warnings] == [
        "hub-studio en2 reaches hub-mini (en2)", "hub-studio en2 reaches hub-mini-2 (en2)"]
    assert topo.to_dot().count('a -- ') == 2


def test_the_shared_port_gets_its_second_address_as_an_alias(hub_case):
    topo = Topology.from_recordings(hub_case)
    assert topo.setup_commands()["hub-studio"] == [
        "sudo ifconfig bridge0 down",
        "sudo ifconfig en2 inet 192.168.0.1 netmask 255.255.255.252",
        "sudo route change 192.168.0.2 -interface en2",
        "sudo ifconfig en2 inet 192.168.0.5 netmask 255.255.255.252 alias",
        "sudo route change 192.168.0.6 -interface en2",
    ]
    assert topo.setup_commands()["hub-mini-2"][1] == "sudo ifconfig en2 inet 192.168.0.6 netmask 255.255.255.252"


def test_no_ring_through_a_hub_star_names_the_partial_rings(hub_case):
    topo = Topology.from_recordings(hub_case)
    with pytest.raises(PlanError, match="Rings found: hub-studio,hub-mini; hub-studio,hub-mini-2"):
        topo.hostfile("ring")


def test_with_the_minis_cabled_the_ring_runs_through_the_hub(hub_ring):
    topo = Topology.from_recordings(hub_ring)
    chosen = topo.choose_backend()
    assert chosen.backend == "ring" and "hub" in chosen.reason
    assert chosen.hostfile == {"backend": "ring", "envs": [], "hosts": [
        {"ssh": "hub-studio", "ips": ["192.168.0.5"], "rdma": []},
        {"ssh": "hub-mini", "ips": ["192.168.0.2"], "rdma": []},
        {"ssh": "hub-mini-2", "ips": ["192.168.0.10"], "rdma": []}]}


def test_host_order_does_not_change_the_cables(hub_ring):
    """Listed downstream-first, the hub cables still start at the upstream port."""
    topo = Topology.from_recordings(hub_ring, ["hub-mini-2", "hub-mini", "hub-studio"])
    kinds = sorted((topo.names[c.a.host], c.a.iface, topo.names[c.b.host], c.kind) for c in topo.cables)
    assert kinds == [("hub-mini-2", "en3", "hub-mini", "direct"), ("hub-studio", "en2", "hub-mini", "hub"),
                     ("hub-studio", "en2", "hub-mini-2", "hub")]


def test_auto_setup_sends_the_alias(hub_ring, tmp_path):
    runner = FakeRunner(hub_ring)
    out, err = io.StringIO(), io.StringIO()
    path = tmp_path / "hostfile.json"
    code = configurator.main(["--hosts", ",".join(HOSTS), "--auto-setup", "--output-hostfile", str(path)],
                       runner=runner, out=out, err=err)
    assert code == 0, err.getvalue()
    topo = Topology.from_recordings(hub_ring)
    for host in HOSTS:
        assert runner.setup_calls(host) == as_run(topo.setup_commands()[host])
    assert ("hub-studio", ("sudo", "-n", "ifconfig", "en2", "inet", "192.168.0.5", "netmask", "255.255.255.252",
                           "alias")) in runner.calls
    assert json.loads(path.read_text())["backend"] == "ring"
    assert err.getvalue().count("through a Thunderbolt hub") == 2 and "already paired" not in err.getvalue()
