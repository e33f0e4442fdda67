"""`--over ethernet`: each host's address on the network that reaches the others (macOS en0/en1, Linux `ip -j`).

Linux outputs are shaped like iproute2's (recorded in a scratch network namespace); addresses are data only.
"""

from __future__ import annotations

import io
import ipaddress
import json

from hypothesis import given, settings, strategies as st

from fake_runner import FakeRunner
from mlx_jupyter import configurator
from mlx_jupyter.topology import CommandResult, DiscoveryError
from mlx_jupyter.topology.ethernet import pick_addresses, route_targets
from mlx_jupyter.topology.netparse import IfAddr, parse_route_get

UNREACHABLE = CommandResult(2, "", "RTNETLINK answers: Network is unreachable\n")


def ip_addr(*addrs: tuple[str, str, int]) -> CommandResult:
    """`ip -j -4 addr show` of a host with loopback and these (interface, address, prefix)."""
    links = [{"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "operstate": "UNKNOWN",
              "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8, "scope": "host", "label": "lo"}]}]
    for k, (ifname, ip, plen) in enumerate(addrs, 2):
        links.append({"ifindex": k, "ifname": ifname, "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
                      "operstate": "UP", "addr_info": [
                          {"family": "inet", "local": ip, "prefixlen": plen, "scope": "global", "label": ifname}]})
    return CommandResult(0, json.dumps(links))


def route(target: str, src: str, dev: str = "eth0", gateway: str | None = None) -> CommandResult:
    """`ip -j -4 route get TARGET` answering with source address `src`."""
    entry = {"dst": target, "dev": dev, "prefsrc": src, "flags": [], "uid": 0, "cache": []}
    if gateway:
        entry["gateway"] = gateway
    return CommandResult(0, json.dumps([entry]))


def linux_runner(addrs: dict[str, CommandResult], routes: dict | None = None, reached: dict | None = None) -> FakeRunner:
    answers = {}
    for host, result in addrs.items():
        answers[(host, ("echo", "success"))] = CommandResult(0, "success\n")
        answers[(host, ("uname", "-s"))] = CommandResult(0, "Linux\n")
        answers[(host, ("ip", "-j", "-4", "addr", "show"))] = result
    for (host, target), answer in (routes or {}).items():
        answers[(host, ("ip", "-j", "-4", "route", "get", target))] = answer
    return FakeRunner(None, answers, reached)


def ethernet(runner: FakeRunner, hosts: list[str], *args: str) -> tuple[int, dict | None, str]:
    out, err = io.StringIO(), io.StringIO()
    code = configurator.main(["--hosts", ",".join(hosts), "--over", "ethernet", *args], runner=runner, out=out, err=err)
    text = out.getvalue()
    hostfile = json.loads(text.split("========\n", 1)[1]) if "Hostfile\n" in text else None
    return code, hostfile, err.getvalue()


def route_gets(runner: FakeRunner, host: str) -> list[str]:
    return [a[-1] for h, a in runner.calls if h == host and a[:5] == ("ip", "-j", "-4", "route", "get")]


def test_shared_subnet_is_used_and_routing_not_asked():
    runner = linux_runner({
        "n1": ip_addr(("docker0", "172.17.0.1", 16), ("eth0", "192.0.2.11", 24)),
        "n2": ip_addr(("docker0", "172.17.0.1", 16), ("eth0", "192.0.2.12", 24)),
    })
    code, hostfile, err = ethernet(runner, ["n1", "n2"], "--backend", "ring")
    assert code == 0, err
    assert hostfile == {"backend": "ring", "envs": [], "hosts": [
        {"ssh": "n1", "ips": ["192.0.2.11"], "rdma": []}, {"ssh": "n2", "ips": ["192.0.2.12"], "rdma": []}]}
    assert route_gets(runner, "n1") == route_gets(runner, "n2") == []


def test_one_host_on_another_subnet_asks_its_routing_table():
    runner = linux_runner(
        {"n1": ip_addr(("eth0", "192.0.2.11", 24)), "n2": ip_addr(("eth0", "192.0.2.12", 24)),
         "n3": ip_addr(("eth0", "198.51.100.7", 24), ("eth1", "203.0.113.7", 24))},
        routes={("n3", "192.0.2.11"): route("192.0.2.11", "203.0.113.7", "eth1", "203.0.113.1")},
    )
    code, hostfile, err = ethernet(runner, ["n1", "n2", "n3"])
    assert code == 0, err
    assert [h["ips"] for h in hostfile["hosts"]] == [["192.0.2.11"], ["192.0.2.12"], ["203.0.113.7"]]
    assert route_gets(runner, "n3") == ["192.0.2.11"]


def test_two_hosts_on_disjoint_routed_subnets():
    """Neither shares a subnet with the other: each asks for the route to the other's addresses."""
    runner = linux_runner(
        {"n1": ip_addr(("docker0", "172.17.0.1", 16), ("eth0", "10.0.1.5", 24)),
         "n2": ip_addr(("docker0", "172.17.0.1", 16), ("eth0", "10.0.2.7", 24))},
        routes={("n1", "10.0.2.7"): route("10.0.2.7", "10.0.1.5", gateway="10.0.1.1"),
                ("n2", "10.0.1.5"): route("10.0.1.5", "10.0.2.7", gateway="10.0.2.1")},
    )
    code, hostfile, err = ethernet(runner, ["n1", "n2"])
    assert code == 0, err
    assert [h["ips"] for h in hostfile["hosts"]] == [["10.0.1.5"], ["10.0.2.7"]]
    # 172.17.0.1 is each host's own address: asking for it would route over loopback
    assert route_gets(runner, "n1") == ["10.0.2.7"] and route_gets(runner, "n2") == ["10.0.1.5"]


def test_unroutable_candidates_are_skipped():
    runner = linux_runner(
        {"n1": ip_addr(("eth0", "10.0.1.5", 24)),
         "n2": ip_addr(("wg0", "10.200.0.2", 24), ("eth0", "10.0.2.7", 24))},
        routes={("n1", "10.200.0.2"): UNREACHABLE,
                ("n1", "10.0.2.7"): route("10.0.2.7", "10.0.1.5", gateway="10.0.1.1"),
                ("n2", "10.0.1.5"): route("10.0.1.5", "10.0.2.7", gateway="10.0.2.1")},
    )
    code, hostfile, err = ethernet(runner, ["n1", "n2"])
    assert code == 0, err
    assert [h["ips"] for h in hostfile["hosts"]] == [["10.0.1.5"], ["10.0.2.7"]]
    assert route_gets(runner, "n1") == ["10.200.0.2", "10.0.2.7"]


def test_the_address_ssh_reached_is_asked_about_first():
    runner = linux_runner(
        {"n1": ip_addr(("eth0", "10.0.1.5", 24)), "n2": ip_addr(("eth0", "10.0.2.7", 24))},
        routes={("n1", "10.0.9.9"): route("10.0.9.9", "10.0.1.5", gateway="10.0.1.1"),
                ("n2", "10.0.1.5"): route("10.0.1.5", "10.0.2.7", gateway="10.0.2.1")},
        reached={"n1": "10.0.1.5", "n2": "10.0.9.9"},  # n2 reached through a NAT, say
    )
    code, hostfile, err = ethernet(runner, ["n1", "n2"])
    assert code == 0, err
    assert [h["ips"] for h in hostfile["hosts"]] == [["10.0.1.5"], ["10.0.2.7"]]
    assert route_gets(runner, "n1") == ["10.0.9.9"] and route_gets(runner, "n2") == ["10.0.1.5"]


def test_no_route_anywhere_is_one_clear_error():
    runner = linux_runner(
        {"n1": ip_addr(("eth0", "10.0.1.5", 24)), "n2": ip_addr(("eth0", "10.0.2.7", 24))},
        routes={("n1", "10.0.2.7"): UNREACHABLE, ("n2", "10.0.1.5"): route("10.0.1.5", "10.0.2.7")},
    )
    code, hostfile, err = ethernet(runner, ["n1", "n2"])
    assert code == 1 and hostfile is None
    assert err.count("error:") == 1 and "Traceback" not in err
    assert "n1: `ip -j -4 route get`" in err and "10.0.2.7: exit 2 RTNETLINK answers: Network is unreachable" in err


def test_garbage_from_route_get_names_host_and_command():
    runner = linux_runner(
        {"n1": ip_addr(("eth0", "10.0.1.5", 24)), "n2": ip_addr(("eth0", "10.0.2.7", 24))},
        routes={("n1", "10.0.2.7"): CommandResult(0, "10.0.2.7 via 10.0.1.1 dev eth0 src 10.0.1.5\n"),
                ("n2", "10.0.1.5"): route("10.0.1.5", "10.0.2.7")},
    )
    code, _, err = ethernet(runner, ["n1", "n2"])
    assert code == 1 and "n1: `ip -j -4 route get 10.0.2.7` did not print JSON" in err


def test_mac_and_linux_together():
    answers = {("mac", ("echo", "success")): CommandResult(0, "success\n"),
               ("mac", ("uname", "-s")): CommandResult(0, "Darwin\n"),
               ("mac", ("ipconfig", "getifaddr", "en0")): CommandResult(1, ""),
               ("mac", ("ipconfig", "getifaddr", "en1")): CommandResult(0, "192.0.2.40\n")}
    runner = linux_runner({"pc": ip_addr(("docker0", "172.17.0.1", 16), ("eth0", "192.0.2.41", 24))})
    runner.answers.update(answers)
    code, hostfile, err = ethernet(runner, ["mac", "pc"])
    assert code == 0, err
    assert [h["ips"] for h in hostfile["hosts"]] == [["192.0.2.40"], ["192.0.2.41"]]


def test_ethernet_on_macs_uses_en0_then_en1():
    from tb_fixtures import FIXTURES

    code, hostfile, err = ethernet(FakeRunner(FIXTURES / "three-macs-triangle"), ["tri-1", "tri-2", "tri-3"])
    assert code == 0, err
    assert [h["ips"] for h in hostfile["hosts"]] == [["10.0.0.41"], ["10.0.0.42"], ["10.0.0.43"]]
    assert hostfile["backend"] == ""


# -- properties ---------------------------------------------------------------------------------

settings.register_profile("ethernet", max_examples=150, deadline=None)
addresses = st.ip_addresses(v=4).map(str)
ifaddrs = st.builds(IfAddr, st.sampled_from(["eth0", "eth1", "docker0", "lo"]), addresses, st.integers(0, 32),
                    st.booleans(), st.booleans())
hosts = st.lists(st.lists(ifaddrs, max_size=4), min_size=1, max_size=5)


@settings(settings.get_profile("ethernet"))
@given(hosts, st.data())
def test_route_targets_never_ask_for_own_or_unusable_addresses(per_host, data):
    chosen = data.draw(st.lists(st.one_of(st.none(), addresses), min_size=len(per_host), max_size=len(per_host)))
    reached = data.draw(st.dictionaries(st.integers(0, len(per_host) - 1), addresses))
    for i, mine in enumerate(per_host):
        targets = route_targets(i, per_host, chosen, reached)
        own = {a.address for a in mine}
        assert len(targets) == len(set(targets)) <= 8
        for t in targets:
            ip = ipaddress.IPv4Address(t)
            assert t not in own and not ip.is_loopback and not ip.is_link_local and not ip.is_multicast
        first = [c for j, c in enumerate(chosen) if j != i and c]
        want = list(dict.fromkeys(c for c in first if c not in own and c in targets))[:8]
        assert targets[:len(want)] == want  # the other hosts' chosen addresses come first


@settings(settings.get_profile("ethernet"))
@given(hosts)
def test_picked_address_is_one_of_the_hosts_own(per_host):
    for mine, picked in zip(per_host, pick_addresses(per_host)):
        assert picked is None or picked in {a.address for a in mine if a.up and not a.loopback}


@settings(settings.get_profile("ethernet"))
@given(addresses, addresses, st.sampled_from(["eth0", "wg0", "enp3s0"]), st.one_of(st.none(), addresses),
       st.booleans())
def test_route_get_round_trip(target, src, dev, gateway, as_list):
    entry = {"dst": target, "dev": dev, "prefsrc": src, "flags": [], "uid": 0, "cache": []}
    if gateway:
        entry["gateway"] = gateway
    text = json.dumps([entry] if as_list else entry)
    assert parse_route_get("h", f"ip -j -4 route get {target}", CommandResult(0, text)) == src


@settings(settings.get_profile("ethernet"))
@given(st.lists(st.dictionaries(st.sampled_from(["dst", "dev", "gateway", "type", "flags"]),
                                st.one_of(st.text(max_size=10), st.integers(), st.none())), max_size=3))
def test_route_get_without_prefsrc_is_a_typed_error(routes):
    try:
        parse_route_get("h", "ip -j -4 route get 1.2.3.4", CommandResult(0, json.dumps(routes)))
    except DiscoveryError as exc:
        assert exc.host == "h" and "prefsrc" in str(exc)
    else:
        raise AssertionError("parsed a route without prefsrc")
