"""The recorded cable check (four-macs-broken-mesh/cablecheck.json): the recorded Macs answer the
check's agent once the setup gave each end its address, so notebook 02 shows real figures (one slow
cable), and a check before the setup warns and fails on every cable, saying why."""

from __future__ import annotations

import io
import json

import pytest

pytest.importorskip("anywidget")

from tb_fixtures import FIXTURES
from mlx_jupyter.configurator import command as config
from mlx_jupyter.configurator.runners import RecordingRunner
from mlx_jupyter.topology import Topology
from mlx_jupyter.topology.cablecheck import targets
from mlx_jupyter.widgets import TopologyWidget
from mlx_jupyter.widgets.topology import SetupNotAppliedWarning

CASE = FIXTURES / "four-macs-broken-mesh"
SLOW = "m3-ultra-2 en4 <-> m3-ultra-4 en4"


def test_the_recording_covers_every_cable_of_the_plan() -> None:
    recorded = {(c["a_ip"], c["b_ip"]): c["cable"] for c in json.loads((CASE / "cablecheck.json").read_text())["cables"]}
    assert recorded == {(t.a_ip, t.b_ip): t.label for t in targets(Topology.from_recordings(CASE))}


def test_after_apply_setup_the_check_shows_each_cable_and_flags_the_slow_one() -> None:
    w = TopologyWidget.from_recordings(CASE)
    w.apply_setup()
    assert w.not_set_up() == []
    report = w.check_cables()
    assert report.summary().endswith("4 ok, 1 flagged, 0 failed")
    by_name = {r.target.name: r for r in report.results}
    slow = by_name[SLOW]
    assert slow.a_to_b_gbps == pytest.approx(11.6, abs=0.01) and slow.b_to_a_gbps == pytest.approx(54.9, abs=0.01)
    assert [f.split(":")[0] for f in slow.flags] == ["slow", "asymmetric"]
    assert all(r.ok and 55 < r.a_to_b_gbps < 58 and 0.07 < r.rtt_ms < 0.08 for n, r in by_name.items() if n != SLOW)
    checks = {c["id"]: c["check"] for c in w.model["cables"]}
    assert sorted(c["state"] for c in checks.values()) == ["flagged", "ok", "ok", "ok", "ok"]
    assert w.status["level"] == "error" and SLOW in w.status["message"]


def test_before_the_setup_the_check_warns_and_says_why_each_cable_fails() -> None:
    w = TopologyWidget.from_recordings(CASE)
    with pytest.warns(SetupNotAppliedWarning, match="setup not applied here on m3-ultra-1, m3-ultra-2, m3-ultra-3, "
                                                    "m3-ultra-4; .*Apply setup first"):
        report = w.check_cables()
    assert len(report.failed) == 5
    assert all(r.error == f"{r.target.b} (serve on {r.target.b_ip}): that address is not on {r.target.b} yet: apply "
               "the setup first (Apply setup, or mlx-jupyter config --auto-setup)" for r in report.results)
    assert w.status["message"].endswith("setup not applied here on m3-ultra-1, m3-ultra-2, m3-ultra-3, m3-ultra-4: "
                                        "press Apply setup, then Check cables")


@pytest.mark.parametrize("auto_setup", [True, False])
def test_config_measure_on_the_recording(auto_setup: bool) -> None:
    out, err = io.StringIO(), io.StringIO()
    hosts = ",".join((CASE / "hosts.txt").read_text().split())
    args = ["--hosts", hosts, "--measure"] + (["--auto-setup"] if auto_setup else [])
    assert config.main(args, runner=RecordingRunner(CASE), out=out, err=err) == 1
    text = out.getvalue().split("Cable check\n===========\n", 1)[1]
    if auto_setup:
        assert "warning: the setup was not applied" not in err.getvalue()
        assert "m3-ultra-2->m3-ultra-4 11.60 Gb/s, m3-ultra-4->m3-ultra-2 54.90 Gb/s, round trip 0.085 ms  <-- slow" in text
        assert text.rstrip().endswith("4 ok, 1 flagged, 0 failed")
    else:
        assert ("warning: the setup was not applied to m3-ultra-1, m3-ultra-2, m3-ultra-3, m3-ultra-4 here: "
                "the cable check needs the plan's addresses") in err.getvalue()
        assert text.rstrip().endswith("0 ok, 0 flagged, 5 failed") and text.count("apply the setup first") == 5
