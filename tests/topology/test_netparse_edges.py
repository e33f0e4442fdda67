"""The small network commands' parsers on exact outputs: each state, each message (topology.netparse)."""

from __future__ import annotations

import json

import pytest

from mlx_jupyter.topology import netparse
from mlx_jupyter.topology.commands import CommandResult
from mlx_jupyter.topology.errors import DiscoveryError
from mlx_jupyter.topology.netparse import (IfAddr, RdmaStatus, is_interface, parse_getifaddr, parse_ibv_devices,
                                           parse_ip_addr, parse_networksetup, parse_route_get)

RDMA_CORE = ("    device          \t   node GUID\n    ------          \t----------------\n\n"
             "    rdma_en2        \t0000000000000000\n    mlx5_0          \t1111\n    rdma_en3        \t0\n")


@pytest.mark.parametrize("result, status", [
    (CommandResult(0, RDMA_CORE), RdmaStatus("enabled", ("rdma_en2", "rdma_en3"))),
    (CommandResult(0, "device\n------\nmlx5_0\n"), RdmaStatus("disabled")),
    (CommandResult(0, ""), RdmaStatus("disabled")),
    (CommandResult(127, ""), RdmaStatus("absent", detail="exit 127")),
    (CommandResult(1, "", "warning\nbash: ibv_devices: command not found\n"),
     RdmaStatus("absent", detail="exit 1: warning")),
    (CommandResult(2, "", "zsh: ibv_devices: not found\n"), RdmaStatus("absent", detail="exit 2: zsh: ibv_devices: not found")),
    (CommandResult(1, RDMA_CORE, "\n  Failed to get IB devices list  \n"),
     RdmaStatus("unknown", detail="exit 1: Failed to get IB devices list")),
    (CommandResult(3, ""), RdmaStatus("unknown", detail="exit 3")),
])
def test_ibv_devices_each_state_and_its_detail(result, status):
    assert parse_ibv_devices("mac1", result) == status
    assert parse_ibv_devices("mac1", result).enabled == (status.state == "enabled")


def test_networksetup_ports_and_refusals():
    out = ("Hardware Port: Thunderbolt 1\nDevice: en2\nEthernet Address: x\n\nHardware Port: \nDevice: en9\n"
           "Hardware Port: Wi-Fi\nDevice:\nHardware Port: Thunderbolt Bridge\nDevice: bridge0\nDevice: en7\n")
    assert parse_networksetup("mac1", CommandResult(0, out)) == {"Thunderbolt 1": "en2", "Thunderbolt Bridge": "bridge0"}
    with pytest.raises(DiscoveryError) as info:
        parse_networksetup("mac1", CommandResult(1, " \n", "no such command\n"))
    assert str(info.value) == "mac1: `networksetup -listallhardwareports` printed nothing (exit 1: no such command)"
    with pytest.raises(DiscoveryError) as info:
        parse_networksetup("mac1", CommandResult(0, "\nAn asterisk (*) denotes\n"))
    assert str(info.value) == ("mac1: `networksetup -listallhardwareports` lists no hardware ports (exit 0); "
                               "it printed: 'An asterisk (*) denotes'")


def test_getifaddr():
    assert parse_getifaddr("mac1", "en2", CommandResult(0, " 192.168.0.1\n")) == "192.168.0.1"
    assert parse_getifaddr("mac1", "en2", CommandResult(1, "  \n")) is None
    with pytest.raises(DiscoveryError) as info:
        parse_getifaddr("mac1", "en2", CommandResult(0, "fe80::1\nmore\n"))
    assert str(info.value) == "mac1: `ipconfig getifaddr en2` printed 'fe80::1', not an IPv4 address"


def _ip(links) -> CommandResult:
    return CommandResult(0, json.dumps(links))


def test_ip_addr_keeps_ipv4_in_order_with_flags():
    links = [{"ifname": "lo", "flags": ["LOOPBACK", "UP"], "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
             {"ifname": "eth0", "flags": ["UP"], "addr_info": [
                 {"family": "inet6", "local": "fe80::1", "prefixlen": 64},
                 {"family": "inet", "local": "10.1.2.3", "prefixlen": 24},
                 {"family": "inet", "local": "10.1.2.4", "prefixlen": 0},
                 {"family": "inet", "local": "10.1.2.5", "prefixlen": 32},
                 {"family": "inet", "local": "10.1.2.6", "prefixlen": 33},
                 {"family": "inet", "local": "10.1.2.7", "prefixlen": -1},
                 {"family": "inet", "local": "10.1.2.8", "prefixlen": True},
                 {"family": "inet", "local": "10.1.2.9", "prefixlen": "24"},
                 {"family": "inet", "local": 5, "prefixlen": 24},
                 {"family": "inet", "local": "10.1.2", "prefixlen": 24}, "junk"]},
             {"ifname": "eth1", "addr_info": [{"family": "inet", "local": "127.0.0.9", "prefixlen": 8}]},
             {"ifname": "eth2", "flags": ["UP"]}]
    got = parse_ip_addr("h1", _ip(links))
    assert got == [IfAddr("lo", "127.0.0.1", 8, True, True), IfAddr("eth0", "10.1.2.3", 24, True, False),
                   IfAddr("eth0", "10.1.2.4", 0, True, False), IfAddr("eth0", "10.1.2.5", 32, True, False),
                   IfAddr("eth1", "127.0.0.9", 8, False, True)]
    assert str(got[1].network) == "10.1.2.0/24"


@pytest.mark.parametrize("links, problem", [
    ({"ifname": "x"}, "printed JSON that is not a list of interfaces"),
    (["eth0"], "an interface entry is not an object"),
    ([{"flags": []}], "an interface entry lacks ifname, flags or addr_info"),
    ([{"ifname": "e", "flags": "UP"}], "an interface entry lacks ifname, flags or addr_info"),
    ([{"ifname": "e", "addr_info": {}}], "an interface entry lacks ifname, flags or addr_info"),
])
def test_ip_addr_refusals_name_the_command(links, problem):
    with pytest.raises(DiscoveryError) as info:
        parse_ip_addr("h1", _ip(links))
    assert str(info.value) == f"h1: `ip -j -4 addr show` {problem}"


def test_route_get_takes_the_first_ipv4_prefsrc():
    cmd = "ip -j route get 10.0.0.2"
    assert parse_route_get("h1", cmd, _ip([{"dst": "x"}, {"prefsrc": "10.0.0.1"}, {"prefsrc": "10.0.0.9"}])) == "10.0.0.1"
    assert parse_route_get("h1", cmd, _ip({"prefsrc": "10.0.0.3"})) == "10.0.0.3"
    for bad in ([{"prefsrc": "fe80::1"}, {"prefsrc": "10.0.0.1"}], [], [{"prefsrc": 1}], "x"):
        with pytest.raises(DiscoveryError) as info:
            parse_route_get("h1", cmd, _ip(bad))
        assert str(info.value) == f"h1: `{cmd}` printed no route with an IPv4 prefsrc"


@pytest.mark.parametrize("name, ok", [("en2", True), ("bridge0", True), ("utun1234", True), ("abcdefghijkl1", True),
                                      ("abcdefghijklm1", False), ("en12345", False), ("en", False), ("2en", False),
                                      ("En2", False), ("en2 ", False), ("en-2", False)])
def test_interface_names(name, ok):
    assert is_interface(name) is ok
    assert netparse.RDMA_HELP.startswith("To enable it")


def test_a_loopback_flag_or_address_makes_it_loopback_and_a_device_before_any_port_is_dropped():
    links = [{"ifname": "lo", "flags": ["LOOPBACK"], "addr_info": [{"family": "inet", "local": "10.9.9.9", "prefixlen": 32}]}]
    assert parse_ip_addr("h1", _ip(links)) == [IfAddr("lo", "10.9.9.9", 32, False, True)]
    out = "Device: en5\nHardware Port: Thunderbolt 1\nDevice: en2\n"
    assert parse_networksetup("mac1", CommandResult(0, out)) == {"Thunderbolt 1": "en2"}
