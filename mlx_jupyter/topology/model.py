"""The cabling model: hosts with Thunderbolt ports, and the cables between them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import TopologyError
from .netparse import RdmaStatus
from .system_profiler import Peer

RDMA_MIN_GBPS = 80.0  # RDMA over Thunderbolt needs Thunderbolt 5 (80 Gb/s and up)


def generation_of(gbps: float | None) -> int | None:
    """Thunderbolt generation implied by a speed: 80+ Gb/s is 5, 40 is 4, less is 3."""
    if gbps is None or gbps <= 0:
        return None
    return 5 if gbps >= 80 else 4 if gbps >= 40 else 3


def speed_text(gbps: float | None) -> str:
    """`80.0` -> "80 Gb/s"; None -> "unknown speed"."""
    return "unknown speed" if gbps is None else f"{gbps:g} Gb/s"


def natural_key(text: str) -> tuple[str | int, ...]:
    """Sort key putting "en2" before "en10"."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


@dataclass(frozen=True)
class Port:
    """A Thunderbolt port of a host: its network interface, domain UUID, speed and peer."""

    iface: str
    uuid: str
    receptacle: str = ""
    link_gbps: float | None = None
    max_gbps: float | None = None
    peer: Peer | None = None  # the (first) Mac at the far end
    hub_peers: tuple[Peer, ...] = ()  # further Macs behind the same hub or dock

    @property
    def peers(self) -> tuple[Peer, ...]:
        """Every Mac this port reaches: one on a direct cable, possibly several behind a hub."""
        return ((self.peer,) if self.peer is not None else ()) + self.hub_peers

    @property
    def generation(self) -> int | None:
        return generation_of(self.max_gbps if self.max_gbps is not None else self.link_gbps)


@dataclass(frozen=True)
class MacHost:
    """One Mac of the cluster as discovery saw it (ports, RDMA, sudo); `mlx_jupyter.hostfile.Host` is a hostfile entry."""

    name: str
    ports: tuple[Port, ...] = ()
    rdma: RdmaStatus | None = None
    ip: str | None = None  # address on the ordinary network (en0, else en1)
    sudo: bool | None = None  # passwordless sudo works
    machine: str | None = None  # e.g. "Mac mini"

    def port(self, iface: str) -> Port:
        return next(p for p in self.ports if p.iface == iface)


@dataclass(frozen=True)
class End:
    """One end of a cable: a host (by index) and its interface."""

    host: int
    iface: str


@dataclass(frozen=True)
class Cable:
    """A Thunderbolt link between two listed hosts, or from a host to a machine outside the list."""

    a: End
    b: End | None  # None: the far end is not in the host list (see `foreign`)
    gbps: float | None = None
    via: tuple[str, ...] = ()  # hubs or docks on the way
    foreign: Peer | None = None

    @property
    def kind(self) -> str:
        return "foreign" if self.b is None else "hub" if self.via else "direct"

    @property
    def generation(self) -> int | None:
        return generation_of(self.gbps)

    @property
    def rdma_capable(self) -> bool:
        """Direct Thunderbolt 5 between two listed hosts."""
        return self.kind == "direct" and self.gbps is not None and self.gbps >= RDMA_MIN_GBPS

    def other(self, host: int) -> End:
        assert self.b is not None
        return self.b if self.a.host == host else self.a

def link_speed(*speeds: float | None) -> float | None:
    """Speed of a link from what its ends report: the slowest known one."""
    known = [s for s in speeds if s is not None]
    return min(known) if known else None


@dataclass
class Wiring:
    """Cables found from the hosts' port reports, and what looked wrong."""

    cables: list[Cable] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _uuid_index(hosts: list[MacHost]) -> dict[str, tuple[int, Port]]:
    """Port domain UUID -> (host index, port); a UUID on two hosts means one Mac listed twice."""
    index: dict[str, tuple[int, Port]] = {}
    for h, host in enumerate(hosts):
        for port in host.ports:
            if port.uuid in index and index[port.uuid][0] != h:
                other = hosts[index[port.uuid][0]].name
                raise TopologyError(
                    f"{other} and {host.name} are the same machine: both report Thunderbolt domain UUID "
                    f"{port.uuid} (system_profiler SPThunderboltDataType). List each Mac once."
                )
            index[port.uuid] = (h, port)
    return index


def find_cables(hosts: list[MacHost]) -> Wiring:
    """Pair up ports by domain UUID; a cable counts when either end sees the other.

    A direct cable uses each of its ports once; a port on a hub reaches every Mac behind
    it. A hub cable's `a` end is the upstream one (the port whose report shows the hub).
    """
    index = _uuid_index(hosts)
    out = Wiring()
    pairs: set[frozenset[str]] = set()  # port-UUID pairs already decided (cable or refusal)
    direct: dict[tuple[int, str], Cable] = {}  # ends of direct cables
    for h, host in enumerate(hosts):
        for port in host.ports:
            for peer in port.peers:
                target = index.get(peer.uuid)
                if target is None:
                    out.cables.append(Cable(End(h, port.iface), None, port.link_gbps, peer.via, peer))
                    continue
                t, tport = target
                if t == h:
                    out.warnings.append(f"{host.name} {port.iface} is cabled to its own port {tport.iface}; ignored")
                    continue
                key = frozenset((port.uuid, tport.uuid))
                if key in pairs:
                    continue  # already seen from the other end
                pairs.add(key)
                back = next((p.via for p in tport.peers if p.uuid == port.uuid), ())
                via = peer.via or back
                if not via and ((h, port.iface) in direct or (t, tport.iface) in direct):
                    out.warnings.append(
                        f"{host.name} {port.iface} reports a cable to {hosts[t].name} {tport.iface}, "
                        "which is already paired with another port; ignored"
                    )
                    continue
                a, b = End(h, port.iface), End(t, tport.iface)
                if via and not peer.via:
                    a, b = b, a
                cable = Cable(a, b, link_speed(port.link_gbps, tport.link_gbps), via)
                out.cables.append(cable)
                if not via:
                    direct[(h, port.iface)] = direct[(t, tport.iface)] = cable
    return out
