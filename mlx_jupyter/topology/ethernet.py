"""Pick each Linux host's address on the network the hosts share (from `ip -j addr`)."""

from __future__ import annotations

import ipaddress
from typing import Sequence

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
