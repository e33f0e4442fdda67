"""Pick each Linux host's address on the network the hosts share (from `ip -j addr`), or what to ask routing."""

from __future__ import annotations

import ipaddress
from typing import Mapping, Sequence

from .netparse import IfAddr


def candidates(addrs: Sequence[IfAddr]) -> list[IfAddr]:
    """Usable addresses: up, not loopback, not link-local."""
    return [a for a in addrs if a.up and not a.loopback and not a.address.startswith("169.254.")]


def pick_addresses(per_host: Sequence[Sequence[IfAddr]]) -> list[str | None]:
    """For each host, the address whose subnet holds an address of the most other hosts.

    None where no address shares a subnet with another host (ask the routing table then);
    with a single host, its first usable address.
    """
    cands = [candidates(a) for a in per_host]
    out: list[str | None] = []
    for i, mine in enumerate(cands):
        best: tuple[int, str] | None = None
        for addr in mine:
            net = addr.network
            peers = sum(
                1 for j, theirs in enumerate(cands) if j != i and any(t.address != addr.address and
                                                                       _in(t.address, net) for t in theirs)
            )
            if best is None or peers > best[0]:
                best = (peers, addr.address)
        if best is None or (best[0] == 0 and len(cands) > 1):
            out.append(None)
        else:
            out.append(best[1])
    return out


def _in(address: str, net: ipaddress.IPv4Network) -> bool:
    return ipaddress.IPv4Address(address) in net


def usable(address: str | None) -> bool:
    """An IPv4 address worth routing to: not loopback, link-local, multicast or unspecified."""
    if not address:
        return False
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified)


def route_targets(
    host: int, per_host: Sequence[Sequence[IfAddr]], chosen: Sequence[str | None],
    reached: Mapping[int, str] | None = None, limit: int = 8,
) -> list[str]:
    """Addresses of the other hosts to ask host `host`'s routing table about, best first.

    First each other host's chosen address, then the address ssh reached it at, then its other
    usable addresses; never one of `host`'s own (that would route over loopback).
    """
    own = {a.address for a in per_host[host]} if host < len(per_host) else set()
    others = [j for j in range(len(chosen)) if j != host]
    order: list[str | None] = [chosen[j] for j in others]
    order += [(reached or {}).get(j) for j in others]
    order += [a.address for j in others if j < len(per_host) for a in candidates(per_host[j])]
    out: list[str] = []
    for address in order:
        if address and usable(address) and address not in own and address not in out:
            out.append(address)
    return out[:limit]
