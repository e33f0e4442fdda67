"""The topology widget's Check cables button: it runs the check through the widget's runner and marks the cables."""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("anywidget")

from check_runner import CheckRunner, Link
from tb_fixtures import FIXTURES
from mlx_jupyter.configurator.measure import CheckOptions
from mlx_jupyter.topology import CommandResult, Topology
from mlx_jupyter.topology.cablecheck import targets
from mlx_jupyter.widgets import TopologyWidget

TRI = FIXTURES / "three-macs-triangle"
# the scripted runner stands for hosts set up beforehand: the widget's warning about it is expected
pytestmark = pytest.mark.filterwarnings("ignore::mlx_jupyter.widgets.topology.SetupNotAppliedWarning")


def widget(links):
    topo = Topology.from_recordings(TRI)
    return TopologyWidget(topo, runner=CheckRunner(links)), targets(topo)


def test_check_button_runs_the_check_and_marks_the_cables():
    ts = targets(Topology.from_recordings(TRI))
    slow, broken = ts[1], ts[2]
    w, _ = widget({(slow.a_ip, slow.b_ip): Link(up_gbps=12.0, down_gbps=39.0),
                   (broken.a_ip, broken.b_ip): Link(send=CommandResult(255, "", f"ssh to {broken.a}: refused\n"))})
    statuses = []
    w.observe(lambda ch: statuses.append(dict(ch["new"])), "status")
    finished = threading.Event()
    w.observe(lambda ch: ch["new"].get("action") == "check" and not ch["new"]["busy"]
              and ch["new"]["level"] != "info" and finished.set(), "status")
    w._on_front_end(w, {"action": "check"}, [])  # the button
    assert finished.wait(30)
    checks = {c["id"]: c["check"] for c in w.model["cables"]}
    first = checks[ts[0].id]
    assert first["state"] == "ok" and first["label"] == "40.0/40.0 Gb/s · 0.05 ms" and first["flags"] == []
    marked = checks[slow.id]
    assert marked["state"] == "flagged" and marked["a_to_b_gbps"] == pytest.approx(12.0)
    assert [f.split(":")[0] for f in marked["flags"]] == ["slow", "asymmetric"]
    failed = checks[broken.id]
    assert failed["state"] == "failed" and failed["error"] == f"{broken.a}: cannot reach it over ssh: ssh to {broken.a}: refused"
    progress = [s for s in statuses if s["action"] == "check" and s["total"] == 3]
    assert [s["done"] for s in progress][-3:] == [1, 2, 3]
    assert w.status["level"] == "error"
    assert w.status["message"].startswith("3 cables checked in ") and "1 ok, 1 flagged, 1 failed" in w.status["message"]
    assert f": {slow.name} (nominal" in w.status["message"]  # the first problem; the others on their cables
    assert w.status["message"].endswith("(and 1 more: hover a cable for its details)")
    json.dumps(w.model)


def test_results_survive_a_backend_change_and_go_with_a_new_topology():
    w, ts = widget({})
    report = w.check_cables(CheckOptions(seconds=0.1))
    assert report.ok and w.status["level"] == "success"
    w.backend = "ring"
    assert all(c["check"]["state"] == "ok" for c in w.model["cables"])
    w.topology = Topology.from_recordings(TRI)
    assert all(c["check"] is None for c in w.model["cables"])


def test_front_end_has_the_button_and_draws_the_results():
    from pathlib import Path

    js = (Path(__import__("mlx_jupyter.widgets", fromlist=["x"]).__file__).parent / "topology.js").read_text()
    assert 'button("Check cables", "check"' in js
    assert "c.check" in js and "ck.label" in js
