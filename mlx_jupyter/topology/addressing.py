"""The /30 address plan for Thunderbolt cables and the per-host commands that apply it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Sequence

from .errors import PlanError
from .model import Cable
from .netparse import is_interface

NETMASK = "255.255.255.252"
CABLES_PER_SUBNET = 64  # a /24 holds 64 /30s
BRIDGE_DOWN = ("ifconfig", "bridge0", "down")
SETUP_PROGRAMS = ("ifconfig", "route")  # all that setup ever runs (as root)


class SetupLine(str):
    """A setup command as printed for a human (`sudo ifconfig ...`) that keeps the argv to run.

    Running it never re-splits the text: `argv` is what was planned, every word validated.
    """

    argv: tuple[str, ...]

    def __new__(cls, argv: Sequence[str]) -> SetupLine:
        line = super().__new__(cls, "sudo " + shlex.join(argv))
        line.argv = tuple(argv)
        return line


@dataclass(frozen=True)
class Link:
    """One addressed cable: each end's interface and address."""

    cable: Cable
    a_ip: str
    b_ip: str

    def side(self, host: int) -> tuple[str, str, str]:
        """(interface, own address, peer address) seen from `host`."""
        assert self.cable.b is not None
        if self.cable.a.host == host:
            return self.cable.a.iface, self.a_ip, self.b_ip
        return self.cable.b.iface, self.b_ip, self.a_ip


def subnet_address(k: int) -> tuple[str, str]:
    """Addresses of the two ends of the k-th cable: 192.168.A.(B+1) and .(B+2)."""
    a, b = divmod(k, CABLES_PER_SUBNET)
    if a > 255:
        raise PlanError(f"ran out of 192.168.x.y addresses: {k + 1} cables need more than 256 /24 subnets")
    return f"192.168.{a}.{b * 4 + 1}", f"192.168.{a}.{b * 4 + 2}"


def address_plan(cables: list[Cable]) -> list[Link]:
    """One /30 per cable between listed hosts, in cable order; foreign cables get none."""
    links: list[Link] = []
    for cable in cables:
        if cable.b is None:
            continue
        a_ip, b_ip = subnet_address(len(links))
        links.append(Link(cable, a_ip, b_ip))
    return links


def links_between(links: list[Link], i: int, j: int) -> list[Link]:
    """The addressed cables joining hosts i and j, in plan order."""
    return [
        lk for lk in links
        if lk.cable.b is not None and {lk.cable.a.host, lk.cable.b.host} == {i, j} and i != j
    ]


def plan_by_pair(links: list[Link], n: int) -> dict[str, list[list[str]]]:
    """`"i,j"` -> [[interface on i, address on i], ...], the k-th entries of i,j and j,i being one cable."""
    out: dict[str, list[list[str]]] = {}
    for i in range(n):
        for j in range(n):
            sides = [list(lk.side(i)[:2]) for lk in links_between(links, i, j)]
            if sides:
                out[f"{i},{j}"] = sides
    return dict(sorted(out.items(), key=lambda kv: tuple(int(x) for x in kv[0].split(","))))


def setup_argv(links: list[Link], names: Sequence[str]) -> list[list[tuple[str, ...]]]:
    """Per host (by index): bridge0 down, then address and route for each of its cables, peers in host order.

    An interface with several cables (a port on a hub) gets its further addresses as aliases.
    """
    out = []
    for i, name in enumerate(names):
        cmds: list[tuple[str, ...]] = [BRIDGE_DOWN]
        addressed: set[str] = set()
        for j in range(len(names)):
            for lk in links_between(links, i, j):
                iface, ip, peer = lk.side(i)
                if not is_interface(iface):
                    raise PlanError(f"{name}: interface name {iface!r} is not of the form en2; refusing to plan commands for it")
                alias = ("alias",) if iface in addressed else ()
                addressed.add(iface)
                cmds.append(("ifconfig", iface, "inet", ip, "netmask", NETMASK, *alias))
                cmds.append(("route", "change", peer, "-interface", iface))
        out.append(cmds)
    return out


def setup_commands(links: list[Link], names: Sequence[str]) -> list[list[SetupLine]]:
    """`setup_argv` as the lines a human runs (`sudo ...`); each line keeps its argv."""
    return [[SetupLine(argv) for argv in host] for host in setup_argv(links, names)]
