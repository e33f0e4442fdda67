"""Launch-parity rules of the configurator (issue 14 §5): speed field names, RDMA gating on unknown
speeds, all-or-none auto-setup, and the plain-list hostfile form MLX 0.29-0.31 read."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tb_fixtures import FIXTURES
from mlx_jupyter.configurator import hosts_to_set_up, hostfile_text
from mlx_jupyter.hostfile import loads_hostfile
from mlx_jupyter.topology import PlanError, Topology
from mlx_jupyter.topology.system_profiler import parse_speed

#: /work/shared/fixtures (beside the checkout or its parent), when present
SHARED = next((p / "shared" / "fixtures" for p in FIXTURES.parents if (p / "shared" / "fixtures").is_dir()), None)


def recorded_speed_values() -> set[str]:
    """Every receptacle_1_tag.current_speed_key value in the recordings (ours and /work/shared's)."""
    roots = [FIXTURES] + ([SHARED] if SHARED and SHARED.exists() else [])
    values: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            tag = node.get("receptacle_1_tag")
            if isinstance(tag, dict) and "current_speed_key" in tag:
                values.add(tag["current_speed_key"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for root in roots:
        for f in root.rglob("system_profiler.json"):
            try:
                walk(json.loads(f.read_text()))
            except ValueError:
                continue  # the malformed recordings
    return values


def test_speed_parser_reads_every_recorded_current_speed_key():
    values = recorded_speed_values()
    assert {"80 Gb/s", "40 Gb/s", "Up to 120 Gb/s"} <= values
    for v in values:
        link, top = parse_speed(v)
        assert (link, top) != (None, None), v
        assert (top is not None) == v.lower().startswith("up to"), v


def unknown_speed_case(tmp_path):
    """two-macs-two-cables with every current_speed_key removed: direct links of unknown speed."""
    case = tmp_path / "case"
    shutil.copytree(FIXTURES / "two-macs-two-cables", case)
    for f in case.rglob("system_profiler.json"):
        f.write_text(re.sub(r'"current_speed_key"\s*:\s*"[^"]*",?', "", f.read_text()))
    return Topology.from_recordings(case)


def test_requested_jaccl_over_unknown_speeds_goes_ahead_naming_each_link(tmp_path):
    topo = unknown_speed_case(tmp_path)
    choice = topo.choose_backend("jaccl")
    assert choice.backend == "jaccl"
    assert len(choice.warnings) == 2 and all("unknown link speed" in w and "studio-" in w for w in choice.warnings)
    assert topo.choose_backend().backend == "ring"   # never picked by itself over unknown speeds


def test_requested_jaccl_over_known_slow_links_is_still_refused():
    topo = Topology.from_recordings(FIXTURES / "tb4-and-tb5-mixed")
    with pytest.raises(PlanError, match="Gb/s"):
        topo.choose_backend("jaccl")


@pytest.mark.parametrize("sudo, auto, partial, allowed, printed", [
    ({"a": True, "b": True}, True, False, ["a", "b"], []),
    ({"a": True, "b": False}, True, False, [], ["a", "b"]),
    ({"a": True, "b": False}, True, True, ["a"], ["b"]),
    ({"a": True, "b": True}, False, False, [], ["a", "b"]),
])
def test_auto_setup_is_all_or_none_unless_partial(sudo, auto, partial, allowed, printed):
    got, why = hosts_to_set_up(sudo, auto, partial)
    assert got == allowed and sorted(why) == printed
    if auto and not partial and printed:
        assert all("b lack(s) passwordless sudo" in why[h] and "--partial-setup" in why[h] for h in printed)


def test_list_form_is_the_plain_list_and_says_what_it_drops():
    data = {"backend": "jaccl", "envs": ["MLX_METAL_FAST_SYNCH=1"],
            "hosts": [{"ssh": "m1", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en3"]},
                      {"ssh": "m2", "ips": [], "rdma": ["rdma_en3", None]}]}
    text, warnings = hostfile_text(data, "list")
    assert isinstance(json.loads(text), list) and loads_hostfile(text).hosts[1].rdma == ["rdma_en3", None]
    assert warnings and "backend jaccl" in warnings[0] and "MLX_METAL_FAST_SYNCH=1" in warnings[0]
    text, warnings = hostfile_text(data, "object")
    hf = loads_hostfile(text)
    assert (hf.backend, hf.envs, warnings) == ("jaccl", ["MLX_METAL_FAST_SYNCH=1"], [])
