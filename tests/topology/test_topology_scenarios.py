"""Every recorded cluster: our answers equal the `correct` part of its expected.json."""

from __future__ import annotations

import re

import pytest

from tb_fixtures import FIXTURES, SCENARIOS, expected
from mlx_jupyter.topology import PlanError, Topology


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
    assert len(extra) == 2 * len(topo.foreign_cables)
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
