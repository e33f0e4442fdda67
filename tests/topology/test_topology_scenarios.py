"""Every recorded cluster: our answers equal the `correct` part of its expected.json."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from tb_fixtures import FIXTURES, SCENARIOS, expected
from mlx_jupyter.topology import PlanError, Topology
from mlx_jupyter.topology.model import speed_text


@pytest.fixture(scope="module", params=SCENARIOS)
def case(request):
    name = request.param
    return name, Topology.from_recordings(FIXTURES / name), expected(name)["correct"]


def test_connectivity(case):
    _, topo, correct = case
    assert topo.connectivity() == correct["connectivity"]


def test_full_mesh(case):
    _, topo, correct = case
    assert topo.is_full_mesh() == correct["full_mesh"]


def test_rings(case):
    _, topo, correct = case
    assert [r.to_json() for r in topo.rings()] == correct["rings"]


def test_dot(case):
    _, topo, correct = case
    assert topo.to_dot(show_foreign=False) == correct["dot"]


def test_dot_with_foreign_machines_adds_only_dashed_lines(case):
    _, topo, correct = case
    ours, theirs = topo.to_dot().splitlines(), correct["dot"].splitlines()
    extra = [line for line in ours if line not in theirs]
    machines = {c.foreign.uuid for c in topo.foreign_cables if c.foreign}
    assert len(extra) == len(machines) + len(topo.foreign_cables)  # a node per machine, an edge per cable
    assert all("dashed" in line for line in extra)


def test_ip_plan(case):
    _, topo, correct = case
    assert topo.ip_plan() == correct["ip_plan"]


def test_setup_commands(case):
    _, topo, correct = case
    assert topo.setup_commands() == correct["setup_commands"]


@pytest.mark.parametrize("backend", ["ring", "jaccl", "jaccl-ring"])
def test_hostfile_or_error(case, backend):
    _, topo, correct = case
    key = backend.replace("-", "_")
    want, error = correct[f"hostfile_{key}"], correct[f"{key}_error"]
    if want is not None:
        assert topo.hostfile(backend) == want
        return
    with pytest.raises(PlanError) as info:
        topo.hostfile(backend)
    assert_mentions(str(info.value), error)


def test_auto(case):
    _, topo, correct = case
    auto = correct["auto"]
    if "error" in auto:
        with pytest.raises(PlanError) as info:
            topo.choose_backend()
        assert_mentions(str(info.value), auto["error"])
        return
    chosen = topo.choose_backend()
    assert chosen.backend == auto["backend"]
    assert chosen.hostfile == auto["hostfile"]
    assert chosen.reason


def test_warnings(case):
    _, topo, correct = case
    ours = topo.warnings
    assert len(ours) == len(correct["warnings"])
    for want in correct["warnings"]:
        words = re.findall(r"[\w.,-]+ en\d+|Mac\d+,\d+|\d+ Gb/s", want)
        assert any(all(w in mine for w in words) for mine in ours), (want, ours)


def assert_mentions(message: str, error: dict) -> None:
    """Our message carries what MLX's (correct) message says, or the words `must_mention` lists."""
    if "must_mention" in error:
        for word in error["must_mention"]:
            assert word in message, (word, message)
        return
    first = error["stderr"].splitlines()[0].removeprefix("[ERROR] ").strip()
    if first.startswith("Incomplete mesh"):
        assert first in message
    else:  # RDMA missing: every host MLX names is named, and RDMA is explained
        hosts = re.findall(r"\[ERROR\] (\S+) does not seem to have RDMA enabled", error["stderr"])
        assert hosts and all(h in message for h in hosts), message
        assert "RDMA" in message


def cable_json(topo: Topology, c) -> dict:
    """One of our cables in expected.json's `cables` form."""
    return {
        "a": topo.names[c.a.host], "a_iface": c.a.iface,
        "b": None if c.b is None else topo.names[c.b.host], "b_iface": None if c.b is None else c.b.iface,
        "speed": speed_text(c.gbps), "via": None if c.kind == "direct" else c.kind,
    }


def test_cables_are_the_ground_truth(case):
    """Every recorded cable once, with its ends, interfaces, speed and kind; a hub cable's `a` is upstream."""
    name, topo, _ = case

    def normal(c: dict) -> tuple:
        ends = ((c["a"], c["a_iface"]), (c["b"], c["b_iface"]))
        if c["via"] is None:  # a direct cable has no direction
            ends = tuple(sorted(ends))
        return ends, c["speed"], c["via"]

    ours = Counter(normal(cable_json(topo, c)) for c in topo.cables)
    assert ours == Counter(normal(c) for c in expected(name)["cables"])


def _missing(name: str) -> list[tuple[int, int]]:
    m = expected(name)["correct"]["connectivity"]
    return [(i, j) for i in range(len(m)) for j in range(i + 1, len(m)) if not m[i][j]]


@pytest.mark.parametrize("name", [n for n in SCENARIOS if _missing(n)])
def test_mesh_error_names_every_missing_pair(name):
    topo = Topology.from_recordings(FIXTURES / name)
    with pytest.raises(PlanError) as info:
        topo.hostfile("jaccl")
    message = str(info.value)
    for i, j in _missing(name):
        assert f"{topo.names[i]} is not connected to {topo.names[j]}" in message, message
    assert "--dot" in message


@pytest.mark.parametrize("name, words", [
    ("eight-macs-ring", ["rack-1 is not connected to rack-3", "rack-4 is not connected to rack-5"]),
    ("four-macs-ring-only", ["mini-a is not connected to mini-d", "mini-b is not connected to mini-c"]),
])
def test_missing_pairs_named_in_the_recorded_meshes(name, words):
    topo = Topology.from_recordings(FIXTURES / name)
    with pytest.raises(PlanError) as info:
        topo.hostfile("jaccl")
    assert all(w in str(info.value) for w in words)
    assert str(info.value).count(" is not connected to ") == len(topo.missing_pairs())


def test_tb4_reason_names_the_slow_host_speed_and_tb5():
    chosen = Topology.from_recordings(FIXTURES / "tb4-and-tb5-mixed").choose_backend()
    assert chosen.backend == "ring"
    for word in ("mini-c", "40 Gb/s", "Thunderbolt 5", "Thunderbolt 4"):
        assert word in chosen.reason, chosen.reason


def test_hub_reason_names_the_hub_as_well_as_rdma():
    chosen = Topology.from_recordings(FIXTURES / "peer-behind-hub").choose_backend()
    assert chosen.backend == "ring"
    for word in ("hub", "Thunderbolt 5 Hub", "hub-studio en2", "RDMA is not enabled", "rdma_ctl enable"):
        assert word in chosen.reason, chosen.reason
