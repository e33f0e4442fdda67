"""Hosts listed by name get the address ssh would reach them at, where the backend needs one."""

from __future__ import annotations

import asyncio
from typing import Optional, Sequence

from mlx_jupyter.vocab.backends import get
from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.net import ssh
from mlx_jupyter.vocab.hosts import is_local
from mlx_jupyter.net.resolve import Address, Lookup, UnresolvedHost, resolve_host, system_lookup


def needing_address(backend: str, hosts: Sequence[Host]) -> list[int]:
    """Ranks without an IP that the backend needs one for: every ring rank; rank 0 of jaccl and nccl
    (the coordinator); none for mpi (mpirun resolves its hosts itself): the record's ``addresses``."""
    needs = get(backend).addresses
    if needs == "every":
        return [r for r, h in enumerate(hosts) if not h.ips]
    if needs == "first" and hosts and not hosts[0].ips:
        return [0]
    return []


def loopback_warning(hosts: Sequence[Host], chosen: Sequence[Address]) -> Optional[str]:
    """A name that resolved to a loopback address while ranks run on other hosts too: they cannot dial it."""
    looped = sorted({a.name for a in chosen if is_local(a.ip)})
    elsewhere = [h for h in hosts if h.ssh not in looped and not is_local(h.ips[0] if h.ips else h.ssh)]
    if not looped or not elsewhere:
        return None
    return (f"warning: {', '.join(looped)} resolved to a loopback address, which ranks on the other hosts cannot "
            "reach; list this machine by an address they reach (or give a hostfile with \"ips\")")


async def fill_addresses(backend: str, hosts: Sequence[Host], options: Optional[ssh.SSHOptions] = None,
                         lookup: Lookup = system_lookup) -> list[str]:
    """Give the hosts that need one their address (in place); return the lines that show the choice.

    Raises :class:`LaunchError` naming every rank whose host does not resolve.
    """
    ranks = needing_address(backend, hosts)
    names = list(dict.fromkeys(hosts[r].ssh for r in ranks))
    if not names:
        return []
    found = await asyncio.gather(*(resolve_host(n, options, lookup) for n in names), return_exceptions=True)
    failed = {n: res for n, res in zip(names, found) if isinstance(res, BaseException)}
    for res in failed.values():
        if not isinstance(res, UnresolvedHost):
            raise res
    if failed:
        lines = [f"host {n!r} (rank {', '.join(str(r) for r in ranks if hosts[r].ssh == n)}): {exc}"
                 for n, exc in failed.items()]
        raise LaunchError(f"{backend}: every rank needs an IP address, and these host names give none:\n  "
                          + "\n  ".join(lines) + "\nlist those hosts by IP, fix the name (or its HostName in the "
                          "ssh config), or give a hostfile with \"ips\"")
    chosen = [res for res in found if isinstance(res, Address)]
    by_name = {a.name: a.ip for a in chosen}
    for r in ranks:
        hosts[r].ips = [by_name[hosts[r].ssh]]
    notes = ["addresses: " + ", ".join(a.describe() for a in chosen)]
    warning = loopback_warning(hosts, chosen)
    return notes + ([warning] if warning else [])
