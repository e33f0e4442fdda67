"""Cable check, pure part: targets from the plan, rounds, Gb/s, parsing the sender's line, flags, report."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from tb_fixtures import FIXTURES
from mlx_jupyter.topology import Topology
from mlx_jupyter.topology.cablecheck import (
    AgentOutputError, CableResult, Report, Target, Thresholds, flags, gbps, judge, parse_transfer, schedule, targets,
)


def tgt(i: int, a: str, b: str, nominal: float | None = 80.0) -> Target:
    return Target(i, a, f"10.0.{i}.1", b, f"10.0.{i}.2", nominal)


def test_targets_follow_the_address_plan():
    topo = Topology.from_recordings(FIXTURES / "three-macs-triangle")
    ts = targets(topo)
    plan = {(lk.a_ip, lk.b_ip) for lk in topo.links()}
    assert len(ts) == 3 and {(t.a_ip, t.b_ip) for t in ts} == plan
    assert all(t.nominal_gbps == 80.0 for t in ts)
    first = ts[0]
    cable = topo.cables[first.id]
    assert (first.a, first.b) == (topo.names[cable.a.host], topo.names[cable.b.host])
    assert first.name == f"{first.a} {cable.a.iface} <-> {first.b} {cable.b.iface}"


def test_foreign_cables_are_not_targets():
    topo = Topology.from_recordings(FIXTURES / "cable-to-foreign-mac")
    assert len(targets(topo)) == len(topo.links()) == len(topo.local_cables)


def test_triangle_needs_three_rounds_and_a_mesh_of_four_three():
    tri = targets(Topology.from_recordings(FIXTURES / "three-macs-triangle"))
    assert [len(r) for r in schedule(tri)] == [1, 1, 1]
    mesh = targets(Topology.from_recordings(FIXTURES / "four-m3-ultra-mesh"))
    assert [len(r) for r in schedule(mesh)] == [2, 2, 2]


edges = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)).filter(lambda e: e[0] != e[1]), max_size=30)


@given(edges)
@settings(max_examples=200, deadline=None)
def test_schedule_property(pairs):
    ts = [tgt(i, f"h{a}", f"h{b}") for i, (a, b) in enumerate(pairs)]
    rounds = schedule(ts)
    flat = [t.id for r in rounds for t in r]
    assert sorted(flat) == list(range(len(ts)))  # every cable exactly once
    for r in rounds:
        hosts = [h for t in r for h in (t.a, t.b)]
        assert len(hosts) == len(set(hosts))  # no host twice in a round
        assert r  # no empty round
    degree: dict[str, int] = {}
    for t in ts:
        for h in (t.a, t.b):
            degree[h] = degree.get(h, 0) + 1
    assert len(rounds) <= max(2 * max(degree.values(), default=0) - 1, 0)  # greedy edge colouring's bound


def test_gbps():
    assert gbps(10**9, 1.0) == 8.0
    assert gbps(5 * 10**9, 0.5) == 80.0
    assert gbps(0, 1.0) == gbps(10, 0.0) == gbps(10, float("inf")) == 0.0


SENT = ('{"role": "send", "up_bytes": 2500000000, "up_ns": 500000000, "down_bytes": 1250000000, '
        '"down_ns": 500000000, "rtt_us": [80.0, 60.0, 70.0, 1000.0]}')


def test_parse_recorded_sender_line():
    tr = parse_transfer("some warning\n" + SENT + "\n")
    assert tr.up_gbps == 40.0 and tr.down_gbps == 20.0
    assert tr.rtt_ms == pytest.approx(0.075)  # median, not the outlier


@pytest.mark.parametrize("text, why", [
    ("", "printed nothing"),
    ("Traceback (most recent call last):\n", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"up_bytes": -1, "up_ns": 1, "down_bytes": 1, "down_ns": 1, "rtt_us": []}', "'up_bytes'"),
    ('{"up_bytes": true, "up_ns": 1, "down_bytes": 1, "down_ns": 1, "rtt_us": []}', "'up_bytes'"),
    ('{"up_bytes": 1, "up_ns": 1, "down_bytes": 1, "down_ns": 1.5, "rtt_us": []}', "'down_ns'"),
    ('{"up_bytes": 1, "up_ns": 1, "down_bytes": 1, "down_ns": 1, "rtt_us": ["x"]}', "'rtt_us'"),
    ('{"up_bytes": 1, "up_ns": 1, "down_bytes": 1, "down_ns": 1}', "'rtt_us'"),
])
def test_malformed_sender_lines_say_what_is_wrong(text, why):
    with pytest.raises(AgentOutputError, match=why):
        parse_transfer(text)


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_parse_any_text_fails_only_cleanly(text):
    try:
        tr = parse_transfer(text)
    except AgentOutputError:
        return
    assert tr.up_gbps >= 0 and tr.down_gbps >= 0


counts = st.integers(0, 2**63)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=8)


@given(st.fixed_dictionaries({"up_bytes": counts, "up_ns": counts, "down_bytes": counts, "down_ns": counts,
                              "rtt_us": st.lists(st.floats(0, 1e9), max_size=30)}),
       st.dictionaries(st.sampled_from(["up_bytes", "up_ns", "down_bytes", "down_ns", "rtt_us", "x"]), json_values))
@settings(max_examples=300, deadline=None)
def test_parse_valid_reports_round_trip_and_junk_is_refused(good, junk):
    tr = parse_transfer(json.dumps(good))
    assert (tr.up_bytes, tr.up_ns, tr.down_bytes, tr.down_ns) == (
        good["up_bytes"], good["up_ns"], good["down_bytes"], good["down_ns"])
    assert tr.rtt_ms is None if not good["rtt_us"] else tr.rtt_ms >= 0
    try:
        parse_transfer(json.dumps({**good, **junk}))
    except AgentOutputError:
        pass


def test_flags_slow_direction_against_nominal():
    t = tgt(0, "a", "b", 80.0)
    assert flags(t, 70.0, 60.0, Thresholds()) == []
    [slow] = flags(t, 70.0, 39.0, Thresholds(asymmetry=10))
    assert slow.startswith("slow: b->a 39.00 Gb/s") and "50% of 80 Gb/s" in slow
    assert flags(t, 70.0, 60.0, Thresholds(slow_fraction=0.9))[0].startswith("slow: a->b 70.00 Gb/s, b->a 60.00")


def test_unknown_speed_is_reported_not_flagged_as_slow():
    t = tgt(0, "a", "b", None)
    assert flags(t, 0.1, 0.1, Thresholds()) == []
    r = judge(t, parse_transfer(SENT.replace("1250000000", "2500000000")), Thresholds())
    assert r.ok and "nominal unknown speed" in r.line() and "40.00 Gb/s" in r.line()


def test_asymmetry():
    t = tgt(0, "a", "b", None)
    assert flags(t, 40.0, 21.0, Thresholds()) == []
    [asym] = flags(t, 40.0, 19.0, Thresholds())
    assert asym.startswith("asymmetric: 40.00 vs 19.00 Gb/s (2.1x")
    assert "one way only" in flags(t, 0.0, 5.0, Thresholds())[0]
    assert flags(t, 0.0, 0.0, Thresholds()) == []  # nothing moved either way: not lopsided (slow, if known)


@pytest.mark.parametrize("fraction, factor", [(0, 2), (1.5, 2), (-0.1, 2), (0.5, 0.9)])
def test_thresholds_are_validated(fraction, factor):
    with pytest.raises(ValueError):
        Thresholds(fraction, factor)


def test_report():
    th = Thresholds()
    ok = judge(tgt(0, "a", "b", 80.0), parse_transfer(SENT.replace("1250000000", "2500000000")), th)
    slow = judge(tgt(1, "b", "c", 80.0), parse_transfer(SENT.replace("1250000000", "1000000000")), th)
    failed = CableResult(tgt(2, "c", "a"), error="c: cannot reach it over ssh: connection refused")
    rep = Report([ok, slow, failed], th, 3.21)
    assert not rep.ok and rep.flagged == [slow] and rep.failed == [failed]
    assert rep.summary() == "3 cables checked in 3.2 s: 1 ok, 1 flagged, 1 failed"
    lines = rep.text().splitlines()
    assert lines[0] == ("a 10.0.0.1 <-> b 10.0.0.2 (nominal Thunderbolt 5, 80 Gb/s): a->b 40.00 Gb/s, "
                        "b->a 40.00 Gb/s, round trip 0.075 ms")
    assert lines[1].endswith("<-- slow: c->b 16.00 Gb/s is under 50% of 80 Gb/s; "
                             "asymmetric: 40.00 vs 16.00 Gb/s (2.5x, over 2x)")  # exactly 50%, 2x: not flagged
    assert lines[2].endswith("FAILED: c: cannot reach it over ssh: connection refused")
    ann = rep.annotations()
    assert ann[0]["state"] == "ok" and ann[0]["label"] == "40.0/40.0 Gb/s · 0.07 ms"
    assert ann[1]["state"] == "flagged" and len(ann[1]["flags"]) == 2
    assert ann[2] == {**ann[2], "state": "failed", "label": "check failed", "error": failed.error}
    json.dumps(rep.to_json())
