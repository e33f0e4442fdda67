"""Hostfiles in the object form mlx.launch reads and mlx.distributed_config writes, for ring, jaccl, jaccl-ring and ethernet, as plain JSON-able dicts."""

from __future__ import annotations

from typing import Any, Sequence

from .addressing import Link, links_between
from .rings import Ring

#: The JSON object a plan writes (mlx_jupyter.hostfile.Hostfile is the parsed one):
#: {"backend": str, "envs": [K=V...], "hosts": [{"ssh", "ips", "rdma"}]}
HostfileDict = dict[str, Any]
Device = str | list[str] | None


def hostfile(backend: str, entries: list[dict[str, Any]], envs: Sequence[str] = ()) -> HostfileDict:
    """The object form of a hostfile."""
    return {"backend": backend, "envs": list(envs), "hosts": entries}


def entry(ssh: str, ips: list[str], rdma: list[Device] | None = None) -> dict[str, Any]:
    return {"ssh": ssh, "ips": ips, "rdma": rdma if rdma is not None else []}


def ring_hostfile(names: list[str], ring: Ring, links: list[Link], envs: Sequence[str] = ()) -> HostfileDict:
    """Hosts in ring order; each lists its addresses on the cables to its ring predecessor."""
    entries = []
    for rank, node in enumerate(ring.nodes):
        pred = ring.nodes[rank - 1]
        cables = links_between(links, node, pred)[: ring.capacity]
        entries.append(entry(names[node], [lk.side(node)[1] for lk in cables]))
    return hostfile("ring", entries, envs)


def _devices(links: list[Link], i: int, j: int, count: int) -> Device:
    names = [f"rdma_{lk.side(i)[0]}" for lk in links_between(links, i, j)[:count]]
    return names[0] if count == 1 else names


def _ips(ip: str | None) -> list[str]:
    return [ip] if ip else []


def jaccl_hostfile(
    names: list[str], ips: list[str | None], links: list[Link], envs: Sequence[str] = ()
) -> HostfileDict:
    """Full mesh: `rdma[i][j]` names i's device(s) on its cable(s) to j; ips are the ethernet addresses."""
    n = len(names)
    count = min((len(links_between(links, i, j)) for i in range(n) for j in range(n) if i != j), default=0)
    entries = []
    for i in range(n):
        row = [None if i == j else _devices(links, i, j, count) for j in range(n)]
        entries.append(entry(names[i], _ips(ips[i]), row))
    return hostfile("jaccl", entries, envs)


def jaccl_ring_hostfile(
    names: list[str], ips: list[str | None], ring: Ring, links: list[Link], envs: Sequence[str] = ()
) -> HostfileDict:
    """RDMA along a ring: hosts in ring order, devices only towards ring neighbours (indexed by rank)."""
    n = len(ring.nodes)
    entries = []
    for rank, node in enumerate(ring.nodes):
        neighbours = {ring.nodes[rank - 1], ring.nodes[(rank + 1) % n]}
        row = [_devices(links, node, other, ring.capacity) if other in neighbours else None for other in ring.nodes]
        entries.append(entry(names[node], _ips(ips[node]), row))
    return hostfile("jaccl-ring", entries, envs)


def ethernet_hostfile(
    names: list[str], ips: list[str | None], backend: str = "", envs: Sequence[str] = ()
) -> HostfileDict:
    """One address per host on the ordinary network, hosts in the order given."""
    return hostfile(backend, [entry(name, _ips(ip)) for name, ip in zip(names, ips)], envs)
