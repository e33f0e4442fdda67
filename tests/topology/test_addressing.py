"""The /30 address plan and the setup commands, on hand-made cables (topology.addressing)."""

from __future__ import annotations

import pytest

from mlx_jupyter.topology import PlanError
from mlx_jupyter.topology.addressing import (NETMASK, address_plan, links_between, plan_by_pair, setup_argv,
                                             subnet_address)
from mlx_jupyter.topology.model import Cable, End


def _cable(a: int, ai: str, b: int | None, bi: str = "en9") -> Cable:
    return Cable(End(a, ai), End(b, bi) if b is not None else None)


def test_the_kth_cable_gets_the_kth_slash_30_up_to_the_last_subnet():
    assert subnet_address(0) == ("192.168.0.1", "192.168.0.2")
    assert subnet_address(63) == ("192.168.0.253", "192.168.0.254")
    assert subnet_address(64) == ("192.168.1.1", "192.168.1.2")
    assert subnet_address(256 * 64 - 1) == ("192.168.255.253", "192.168.255.254")
    with pytest.raises(PlanError, match="ran out of 192.168.x.y addresses: 16385 cables need more than 256"):
        subnet_address(256 * 64)


def test_a_cable_to_an_unlisted_machine_gets_no_address_and_the_next_ones_go_on():
    cables = [_cable(0, "en1", 1, "en1"), _cable(0, "en2", None), _cable(1, "en2", 2, "en2")]
    links = address_plan(cables)
    assert [(lk.cable, lk.a_ip, lk.b_ip) for lk in links] == [
        (cables[0], "192.168.0.1", "192.168.0.2"), (cables[2], "192.168.0.5", "192.168.0.6")]


def test_links_between_two_hosts_in_plan_order_and_none_to_itself():
    cables = [_cable(0, "en1", 1, "en1"), _cable(1, "en2", 2, "en2"), _cable(1, "en3", 0, "en3")]
    links = address_plan(cables)
    assert links_between(links, 0, 1) == [links[0], links[2]] == links_between(links, 1, 0)
    assert links_between(links, 1, 1) == [] and links_between(links, 0, 2) == []


def test_plan_by_pair_lists_each_cable_from_both_sides_in_host_order():
    links = address_plan([_cable(2, "en1", 0, "en4"), _cable(0, "en2", 1, "en2"), _cable(1, "en5", 2, "en6")])
    assert plan_by_pair(links, 3) == {
        "0,1": [["en2", "192.168.0.5"]], "0,2": [["en4", "192.168.0.2"]],
        "1,0": [["en2", "192.168.0.6"]], "1,2": [["en5", "192.168.0.9"]],
        "2,0": [["en1", "192.168.0.1"]], "2,1": [["en6", "192.168.0.10"]],
    }
    assert list(plan_by_pair(links, 3)) == ["0,1", "0,2", "1,0", "1,2", "2,0", "2,1"]
    twelve = address_plan([_cable(10, "en1", 2, "en1"), _cable(1, "en1", 11, "en1")])   # 10 sorts after 2 as a number
    assert list(plan_by_pair(twelve, 12)) == ["1,11", "2,10", "10,2", "11,1"]
    assert plan_by_pair([], 3) == {}


def test_a_port_with_two_cables_gets_its_second_address_as_an_alias():
    # one port of host 0 to a hub reaching hosts 1 and 2
    links = address_plan([Cable(End(0, "en1"), End(1, "en1"), via=("hub",)),
                          Cable(End(0, "en1"), End(2, "en1"), via=("hub",)), _cable(0, "en2", 1, "en2")])
    host0 = setup_argv(links, ["m0", "m1", "m2"])[0]
    assert host0 == [
        ("ifconfig", "bridge0", "down"),
        ("ifconfig", "en1", "inet", "192.168.0.1", "netmask", NETMASK),
        ("route", "change", "192.168.0.2", "-interface", "en1"),
        ("ifconfig", "en2", "inet", "192.168.0.9", "netmask", NETMASK),
        ("route", "change", "192.168.0.10", "-interface", "en2"),
        ("ifconfig", "en1", "inet", "192.168.0.5", "netmask", NETMASK, "alias"),
        ("route", "change", "192.168.0.6", "-interface", "en1"),
    ]


def test_no_cables_no_commands_but_bridge0_down():
    assert address_plan([_cable(0, "en3", None)]) == [] and setup_argv([], ["m0"]) == [[("ifconfig", "bridge0", "down")]]
