"""Property tests: every parser returns or raises DiscoveryError, never anything else; round-trips."""

from __future__ import annotations

import ipaddress
import json

from hypothesis import given, settings, strategies as st

from mlx_jupyter.topology import CommandResult, DiscoveryError, Topology
from mlx_jupyter.topology.commands import IBV_DEVICES, NETWORKSETUP, SYSTEM_PROFILER, getifaddr
from mlx_jupyter.topology.discover import host_from_outputs
from mlx_jupyter.topology.netparse import (
    parse_getifaddr, parse_ibv_devices, parse_ip_addr, parse_networksetup, parse_route_get,
)
from mlx_jupyter.topology.system_profiler import parse_speed, parse_system_profiler

settings.register_profile("topology", max_examples=150, deadline=None)
settings.load_profile("topology")

texts = st.text(max_size=300)
# JSON-ish values, including the keys the parser looks for, at any depth
KEYS = st.sampled_from(["SPThunderboltDataType", "_items", "_name", "domain_uuid_key", "receptacle_1_tag",
                        "receptacle_id_key", "current_speed_key", "device_name_key", "services_title", "x",
                        "ifname", "flags", "addr_info", "family", "local", "prefixlen", "prefsrc"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=30,
)


def result(stdout: str, rc: int = 0, stderr: str = "") -> CommandResult:
    return CommandResult(rc, stdout, stderr)


def only_discovery_errors(fn, *args) -> None:
    try:
        fn(*args)
    except DiscoveryError as exc:
        assert exc.host == "h" and exc.command
        assert str(exc).startswith("h: `")


@given(texts, st.integers(-1, 255), texts)
def test_system_profiler_garbage_text(stdout, rc, stderr):
    only_discovery_errors(parse_system_profiler, "h", result(stdout, rc, stderr))


@given(json_values)
def test_system_profiler_random_json(value):
    only_discovery_errors(parse_system_profiler, "h", result(json.dumps(value)))
    only_discovery_errors(parse_system_profiler, "h", result(json.dumps({"SPThunderboltDataType": value})))
    only_discovery_errors(parse_system_profiler, "h", result(json.dumps({"SPThunderboltDataType": [value]})))


@given(st.integers(1, 5000))
def test_deeply_nested_json_is_a_typed_error(depth):
    only_discovery_errors(parse_system_profiler, "h", result("[" * depth + "]" * depth))
    nested: dict = {"domain_uuid_key": "P"}
    for _ in range(min(depth, 300)):
        nested = {"_items": [nested], "_name": "hub"}
    bus = {"domain_uuid_key": "U", "receptacle_1_tag": {"receptacle_id_key": "1"}, "_items": [nested]}
    buses, _ = parse_system_profiler("h", result(json.dumps({"SPThunderboltDataType": [bus]})))
    assert buses[0].peer is not None and buses[0].peer.uuid == "P"


@given(texts, st.integers(-1, 255), texts)
def test_small_parsers_garbage(stdout, rc, stderr):
    r = result(stdout, rc, stderr)
    only_discovery_errors(parse_networksetup, "h", r)
    only_discovery_errors(parse_ibv_devices, "h", r)
    only_discovery_errors(parse_getifaddr, "h", "en0", r)
    only_discovery_errors(parse_ip_addr, "h", r)
    only_discovery_errors(parse_route_get, "h", "ip -j -4 route get 1.2.3.4", r)


@given(json_values)
def test_ip_parsers_random_json(value):
    text = json.dumps(value)
    only_discovery_errors(parse_ip_addr, "h", result(text))
    only_discovery_errors(parse_ip_addr, "h", result(json.dumps([value])))
    only_discovery_errors(parse_route_get, "h", "ip route get", result(text))


@given(st.dictionaries(st.sampled_from([SYSTEM_PROFILER, NETWORKSETUP, IBV_DEVICES, getifaddr("en0")]),
                       st.builds(result, texts, st.integers(0, 255), texts)))
def test_whole_host_from_garbage(outputs):
    try:
        host_from_outputs("h", outputs)
    except DiscoveryError as exc:
        assert exc.host == "h"


# -- round trips --------------------------------------------------------------------------------

names = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters=" -_()"), min_size=1,
                max_size=20).map(str.strip).filter(bool)
devices = st.from_regex(r"[a-z][a-z0-9]{0,7}", fullmatch=True)


@given(st.dictionaries(names, devices, min_size=1, max_size=8))
def test_networksetup_round_trip(ports):
    text = "\n" + "".join(f"Hardware Port: {n}\nDevice: {d}\nEthernet Address: 00:11:22:33:44:55\n\n"
                          for n, d in ports.items()) + "VLAN Configurations\n===================\n"
    assert parse_networksetup("h", result(text)) == ports


@given(st.lists(st.from_regex(r"rdma_en[0-9]{1,2}", fullmatch=True), unique=True, max_size=6),
       st.booleans())
def test_ibv_devices_round_trip(devs, indent):
    pad = "    " if indent else ""
    lines = [f"{pad}device          \t   node GUID", f"{pad}------          \t----------------"]
    lines += [f"{pad}{d}        \t801cea6f612aac05" for d in devs]
    status = parse_ibv_devices("h", result("\n".join(lines) + "\n"))
    assert status.devices == tuple(devs)
    assert status.enabled == bool(devs)


@given(st.ip_addresses(v=4))
def test_getifaddr_round_trip(ip):
    assert parse_getifaddr("h", "en0", result(f"{ip}\n")) == str(ip)


@given(st.lists(st.tuples(devices, st.ip_addresses(v=4), st.integers(0, 32)), max_size=6))
def test_ip_addr_round_trip(entries):
    links = [{"ifname": n, "flags": ["UP"], "addr_info": [{"family": "inet", "local": str(ip), "prefixlen": p}]}
             for n, ip, p in entries]
    parsed = parse_ip_addr("h", result(json.dumps(links)))
    assert [(a.ifname, a.address, a.prefixlen) for a in parsed] == [(n, str(ip), p) for n, ip, p in entries]


@given(st.integers(1, 400), st.booleans())
def test_speed_round_trip(gbps, idle):
    text = f"Up to {gbps} Gb/s" if idle else f"{gbps} Gb/s"
    assert parse_speed(text) == ((None, gbps) if idle else (gbps, None))


uuids = st.uuids().map(lambda u: str(u).upper())


@given(st.lists(st.tuples(uuids, st.one_of(st.none(), uuids), st.sampled_from([40, 80, 120]),
                          st.integers(0, 3)), min_size=1, max_size=6, unique_by=lambda t: t[0]))
def test_system_profiler_round_trip(spec):
    """Buses written in system_profiler's shape (peers behind 0-3 hubs) parse back to the same."""
    entries = []
    for n, (uuid, peer, speed, hubs) in enumerate(spec):
        bus = {"_name": f"thunderboltusb4_bus_{n}", "domain_uuid_key": uuid,
               "receptacle_1_tag": {"receptacle_id_key": str(n + 1),
                                    "current_speed_key": f"{speed} Gb/s" if peer else f"Up to {speed} Gb/s"}}
        if peer:
            item: dict = {"_name": "Mac", "domain_uuid_key": peer}
            for k in range(hubs):
                item = {"_name": f"hub{k}", "_items": [item]}
            bus["_items"] = [item]
        entries.append(bus)
    buses, warnings = parse_system_profiler("h", result(json.dumps({"SPThunderboltDataType": entries})))
    assert warnings == []
    assert [(b.uuid, b.peer.uuid if b.peer else None, b.receptacle) for b in buses] == \
        [(u, p, str(n + 1)) for n, (u, p, _, _) in enumerate(spec)]
    assert [len(b.peer.via) for b in buses if b.peer] == [h for _, p, _, h in spec if p]
    assert [b.link_gbps if b.peer else b.max_gbps for b in buses] == [s for _, _, s, _ in spec]


def test_recordings_are_stable():
    """The same folder gives the same topology (pure parsing)."""
    from tb_fixtures import FIXTURES

    a = Topology.from_recordings(FIXTURES / "eight-macs-ring")
    b = Topology.from_recordings(FIXTURES / "eight-macs-ring")
    assert a.cables == b.cables and a.hosts == b.hosts
    assert ipaddress.IPv4Address(a.ip_plan()["0,1"][0][1])


@given(st.lists(uuids, min_size=1, max_size=4, unique=True), st.integers(1, 3))
def test_every_mac_behind_a_hub_is_a_peer(macs, depth):
    """Macs on a hub (nested `depth` devices deep, the last holding all of them) come back in listed order."""
    item: dict = {"_name": "dock", "_items": [{"_name": "Mac", "domain_uuid_key": m,
                                                "_items": [{"domain_uuid_key": "NOT-SEARCHED"}]} for m in macs]}
    for k in range(depth - 1):
        item = {"_name": f"hub{k}", "_items": [{"_name": "keyboard"}, item]}
    bus = {"_name": "thunderboltusb4_bus_0", "domain_uuid_key": "U", "_items": [item],
           "receptacle_1_tag": {"receptacle_id_key": "1", "current_speed_key": "80 Gb/s"}}
    [parsed], _ = parse_system_profiler("h", result(json.dumps({"SPThunderboltDataType": [bus]})))
    assert [p.uuid for p in parsed.peers] == macs
    assert all(len(p.via) == depth for p in parsed.peers)
