"""`Topology`: the one handle on a cluster's cabling, with every view the planner and widgets need."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Mapping, Sequence

from . import addressing, choice, rings
from .addressing import Link
from .discover import Outputs, host_from_outputs
from .hostfile_plan import HostfileDict, ethernet_hostfile
from .rings import Ring
from .model import Cable, MacHost, find_cables, speed_text


class Topology:
    """Hosts (in the user's order), their Thunderbolt ports and the cables between them."""

    def __init__(self, hosts: Sequence[MacHost], warnings: Sequence[str] = ()) -> None:
        self.hosts: list[MacHost] = list(hosts)
        wiring = find_cables(self.hosts)
        self.cables: list[Cable] = wiring.cables
        self._warnings = list(warnings) + wiring.warnings

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_outputs(
        cls, names: Sequence[str], outputs: Mapping[str, Outputs], sudo: Mapping[str, bool] | None = None
    ) -> Topology:
        """Build from each host's command outputs (live discovery or recordings)."""
        hosts, warnings = [], []
        for name in names:
            host, more = host_from_outputs(name, outputs.get(name, {}), (sudo or {}).get(name))
            hosts.append(host)
            warnings += more
        return cls(hosts, warnings)

    @classmethod
    def from_recordings(cls, folder: str | Path, hosts: Sequence[str] | None = None) -> Topology:
        """Build from a folder laid out like tests/fixtures/thunderbolt/<case>/."""
        from .recordings import load_case

        names, outputs, sudo = load_case(Path(folder), hosts)
        return cls.from_outputs(names, outputs, sudo)

    # -- views ----------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def ips(self) -> list[str | None]:
        """Each host's ordinary-network address (en0, else en1), or None."""
        return [h.ip for h in self.hosts]

    @property
    def local_cables(self) -> list[Cable]:
        """Cables whose both ends are listed hosts."""
        return [c for c in self.cables if c.b is not None]

    @property
    def foreign_cables(self) -> list[Cable]:
        return [c for c in self.cables if c.b is None]

    def connectivity(self) -> list[list[int]]:
        """`[i][j]` = number of cables between hosts i and j (symmetric)."""
        n = len(self.hosts)
        m = [[0] * n for _ in range(n)]
        for c in self.local_cables:
            assert c.b is not None
            if c.a.host != c.b.host:
                m[c.a.host][c.b.host] += 1
                m[c.b.host][c.a.host] += 1
        return m

    def rings(self) -> list[Ring]:
        """Every ring, one per set of hosts, longest first."""
        return self._rings

    @cached_property
    def _rings(self) -> list[Ring]:
        return rings.find_rings(self.connectivity())

    def full_ring(self) -> Ring | None:
        """A ring through every host, if the cabling has one."""
        return rings.full_ring(self._rings, len(self.hosts))

    def missing_pairs(self) -> list[tuple[int, int]]:
        """Host pairs (i < j) without a cable: what keeps this from being a full mesh."""
        return rings.missing_pairs(self.connectivity())

    def is_full_mesh(self) -> bool:
        return not self.missing_pairs()

    def links(self) -> list[Link]:
        """The /30 address plan: one entry per cable between listed hosts."""
        return self._links

    @cached_property
    def _links(self) -> list[Link]:
        return addressing.address_plan(self.cables)

    def ip_plan(self) -> dict[str, list[list[str]]]:
        """`"i,j"` -> [[interface on i, address on i], ...] (k-th entries of i,j and j,i = one cable)."""
        return addressing.plan_by_pair(self._links, len(self.hosts))

    def setup_commands(self) -> dict[str, list[addressing.SetupLine]]:
        """Per host name, the commands that apply the address plan (`sudo ...` lines that keep their argv)."""
        return dict(zip(self.names, addressing.setup_commands(self._links, self.names)))

    @property
    def warnings(self) -> list[str]:
        """Things a user should know: skipped inputs, hubs, unlisted peers, links too slow for RDMA."""
        out = list(self._warnings)
        for c in self.cables:
            a = f"{self.names[c.a.host]} {c.a.iface}"
            if c.b is None:
                peer = c.foreign
                who = (peer.name or "a machine") if peer else "a machine"
                model = f" ({peer.model})" if peer and peer.model else ""
                out.append(f"{a} is cabled to a {who}{model} that is not in the host list; that cable is ignored")
                continue
            b = f"{self.names[c.b.host]} ({c.b.iface})"
            if c.via:
                out.append(f"{a} reaches {b} through a Thunderbolt hub ({', '.join(c.via)}): "
                           "bandwidth is shared and RDMA is not used over it")
            elif c.gbps is not None and c.generation is not None and c.generation < 5:
                out.append(f"{choice.describe(self, c)} runs at {speed_text(c.gbps)} "
                           f"(Thunderbolt {c.generation}): no RDMA on this link")
        return out

    # -- plans and hostfiles ----------------------------------------------------------------------

    def choose_backend(self, backend: str | None = None, envs: Sequence[str] = ()) -> choice.Choice:
        """Plan `backend` (or pick the best one) and say why; raises PlanError when impossible."""
        return choice.choose(self, backend, envs)

    def hostfile(self, backend: str, envs: Sequence[str] = ()) -> HostfileDict:
        """The hostfile for `backend` ("ring", "jaccl", "jaccl-ring"); raises PlanError when impossible."""
        return choice.choose(self, backend, envs).hostfile

    def ethernet_hostfile(self, backend: str = "", envs: Sequence[str] = ()) -> HostfileDict:
        """A hostfile over the ordinary network (each host's en0/en1 address)."""
        return ethernet_hostfile(self.names, self.ips, backend, envs)

    # -- renderings -------------------------------------------------------------------------------

    def to_dot(self, show_foreign: bool = True) -> str:
        """GraphViz text: one edge per cable, machines outside the host list dashed."""
        from .render_dot import to_dot

        return to_dot(self, show_foreign)

    def to_svg(self) -> str:
        """A self-contained SVG picture of the cabling."""
        from .render_svg import to_svg

        return to_svg(self)

    def _repr_svg_(self) -> str:
        return self.to_svg()

    def __repr__(self) -> str:
        return f"Topology(hosts={self.names!r}, cables={len(self.local_cables)}, foreign={len(self.foreign_cables)})"
