"""Which backend a cabling supports, and the hostfile for it; every refusal says why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from mlx_jupyter.vocab.backends import RECORDS, get

from .cabling import Cabling
from .addressing import links_between
from .commands import getifaddr, show
from .errors import PlanError
from .hostfile_plan import HostfileDict, jaccl_hostfile, jaccl_ring_hostfile, ring_hostfile
from .model import Cable
from .netparse import RDMA_HELP
from .rings import Ring


#: The backends the configurator can plan: those whose record (mlx_jupyter.vocab.backends) says so, the ones
#: that run over Thunderbolt; nccl and mpi need no cabling plan.
CONFIG_BACKENDS = tuple(b.name for b in RECORDS if b.configurable)
DOT_HINT = "Run with --dot to see the cabling."
RING_ADVICE = " Use the ring backend (--backend ring)."


@dataclass
class Choice:
    """A backend, why it was chosen, and its hostfile."""

    backend: str
    reason: str
    hostfile: HostfileDict
    ring: Ring | None = None
    warnings: list[str] = field(default_factory=list)


def ring_problem(topo: Cabling) -> str | None:
    """Why no ring covers every host, or None when one does."""
    if len(topo.hosts) < 2:
        return "a ring needs at least two hosts"
    if topo.full_ring() is not None:
        return None
    partial = [",".join(topo.names[i] for i in r.nodes) for r in topo.rings()]
    text = "Could not find a ring through all hosts."
    if partial:
        text += " Rings found: " + "; ".join(partial) + "."
    else:
        text += " No rings found at all."
    return f"{text} {DOT_HINT}"


def mesh_problem(topo: Cabling) -> str | None:
    """Every missing pair of a full mesh, or None when every pair is cabled."""
    missing = topo.missing_pairs()
    if not missing:
        return None
    pairs = "; ".join(f"{topo.names[i]} is not connected to {topo.names[j]}" for i, j in missing)
    return f"Incomplete mesh, {pairs}. {DOT_HINT}"


def rdma_problem(topo: Cabling) -> str | None:
    """Hosts without usable RDMA, grouped by cause, each cause with its fix."""
    by_state: dict[str, list[str]] = {}
    details: list[str] = []
    for h in topo.hosts:
        state = "unknown" if h.rdma is None else h.rdma.state
        if state == "enabled":
            continue
        by_state.setdefault(state, []).append(h.name)
        if h.rdma is not None and h.rdma.state in ("absent", "unknown"):
            details.append(f"{h.name}: {h.rdma.detail}")
    if not by_state:
        return None
    parts = []
    if "disabled" in by_state:
        parts.append(f"RDMA is not enabled on {', '.join(by_state['disabled'])} "
                     f"(`ibv_devices` lists no rdma_* device). {RDMA_HELP}.")
    if "absent" in by_state:
        parts.append(f"`ibv_devices` is not installed on {', '.join(by_state['absent'])}: "
                     "RDMA over Thunderbolt needs macOS 26.2 or later.")
    if "unknown" in by_state:
        parts.append(f"RDMA support is unknown on {', '.join(by_state['unknown'])} (`ibv_devices` failed or was not run).")
    if details:
        parts.append("(" + "; ".join(details) + ")")
    return " ".join(parts)


def describe(topo: Cabling, cable: Cable) -> str:
    """`studio-a en3 <-> mini-c en2`."""
    a = f"{topo.names[cable.a.host]} {cable.a.iface}"
    if cable.b is None:
        return f"{a} <-> (unlisted machine)"
    return f"{a} <-> {topo.names[cable.b.host]} {cable.b.iface}"


def why_not_rdma(topo: Cabling, cable: Cable) -> str:
    """Why one cable cannot carry RDMA."""
    if cable.via:
        return f"{describe(topo, cable)} goes through a hub ({', '.join(cable.via)})"
    if cable.gbps is None:
        return f"{describe(topo, cable)} has an unknown link speed"
    gen = cable.generation
    return f"{describe(topo, cable)} runs at {cable.gbps:g} Gb/s (Thunderbolt {gen})"


def unknown_speed(cable: Cable) -> bool:
    """A direct cable whose link speed system_profiler did not report (``current_speed_key``)."""
    return cable.kind == "direct" and cable.gbps is None


def links_problem(topo: Cabling, cables: list[Cable], backend: str, requested: bool = False) -> str | None:
    """Why some of the cables a backend would use cannot carry RDMA (``requested``: unknown speeds pass)."""
    bad = [c for c in cables if not c.rdma_capable and not (requested and unknown_speed(c))]
    if not bad:
        return None
    return (
        f"RDMA ({backend}) needs direct Thunderbolt 5 links (80 Gb/s) on every link it uses, but "
        + "; ".join(why_not_rdma(topo, c) for c in bad)
        + "."
        + RING_ADVICE
    )


def coordinator_problem(topo: Cabling, order: Sequence[int]) -> str | None:
    """jaccl needs rank 0's ordinary-network address for its coordinator."""
    first = topo.hosts[order[0]]
    if first.ip:
        return None
    return (
        f"{first.name} (rank 0, the coordinator) has no IPv4 address on en0 or en1 "
        f"(`{show(getifaddr('en0'))}` and `{show(getifaddr('en1'))}` printed nothing). "
        "Connect it to the network, or list a host with an address first."
    )


def mesh_cables(topo: Cabling) -> list[Cable]:
    """The cables a jaccl mesh uses: the first k of every pair, k = the fewest any pair has."""
    n = len(topo.hosts)
    links = topo.links()
    count = min((len(links_between(links, i, j)) for i in range(n) for j in range(i + 1, n)), default=0)
    return [lk.cable for i in range(n) for j in range(i + 1, n) for lk in links_between(links, i, j)[:count]]


def ring_cables(topo: Cabling, ring: Ring) -> list[Cable]:
    """The cables a ring uses: the first `capacity` of every hop."""
    links = topo.links()
    return [lk.cable for a, b in ring.hops() for lk in links_between(links, a, b)[: ring.capacity]]


def _fail(*problems: str | None) -> None:
    found = [p for p in problems if p]
    if found:
        raise PlanError(found[0])


def plan_ring(topo: Cabling, envs: Sequence[str], reason: str) -> Choice:
    _fail(ring_problem(topo))
    ring = topo.full_ring()
    assert ring is not None
    return Choice("ring", reason, ring_hostfile(topo.names, ring, topo.links(), envs), ring)


def unknown_speed_warnings(topo: Cabling, cables: list[Cable], backend: str) -> list[str]:
    """A requested RDMA backend goes ahead over links of unknown speed: name each one."""
    return [f"{backend} was requested: {describe(topo, c)} has an unknown link speed (no current_speed_key); "
            "RDMA needs Thunderbolt 5, so check that cable" for c in cables if unknown_speed(c)]


def plan_jaccl(topo: Cabling, envs: Sequence[str], reason: str, requested: bool = False) -> Choice:
    cables = mesh_cables(topo)
    _fail(mesh_problem(topo), rdma_problem(topo), links_problem(topo, cables, "jaccl", requested),
          coordinator_problem(topo, range(len(topo.hosts))))
    warnings = unknown_speed_warnings(topo, cables, "jaccl") if requested else []
    return Choice("jaccl", reason, jaccl_hostfile(topo.names, topo.ips, topo.links(), envs), warnings=warnings)


def plan_jaccl_ring(topo: Cabling, envs: Sequence[str], reason: str, requested: bool = False) -> Choice:
    _fail(ring_problem(topo), rdma_problem(topo))
    ring = topo.full_ring()
    assert ring is not None
    cables = ring_cables(topo, ring)
    _fail(links_problem(topo, cables, "jaccl-ring", requested), coordinator_problem(topo, ring.nodes))
    warnings = unknown_speed_warnings(topo, cables, "jaccl-ring") if requested else []
    return Choice("jaccl-ring", reason, jaccl_ring_hostfile(topo.names, topo.ips, ring, topo.links(), envs), ring,
                  warnings)


def choose(topo: Cabling, backend: str | None = None, envs: Sequence[str] = ()) -> Choice:
    """Plan `backend`, or pick one: RDMA only with RDMA on every host and Thunderbolt 5 on every link used."""
    if len(topo.hosts) < 2:
        raise PlanError(f"a cluster needs at least two hosts; got {', '.join(topo.names) or 'none'}")
    if backend is not None:
        if backend not in CONFIG_BACKENDS:
            raise PlanError(f"unknown backend {backend!r}; choose one of {', '.join(CONFIG_BACKENDS)}")
        rdma = get(backend).rdma   # the record says what its cabling plan needs
        if not rdma:
            return plan_ring(topo, envs, f"{backend} was requested")
        planner = plan_jaccl if rdma == "every" else plan_jaccl_ring
        return planner(topo, envs, f"{backend} was requested", requested=True)
    ring_why, mesh_why = ring_problem(topo), mesh_problem(topo)
    if ring_why and mesh_why:
        raise PlanError(f"Neither a full mesh nor a ring through all hosts. {mesh_why} {ring_why}")
    rdma_why = rdma_problem(topo)
    declined: list[str] = []
    if rdma_why:
        declined.append(rdma_why)
        # name the links too, so enabling RDMA is not offered as the whole fix
        ring = topo.full_ring()
        used = mesh_cables(topo) if not mesh_why else ring_cables(topo, ring) if ring else []
        slow = links_problem(topo, used, "jaccl" if not mesh_why else "jaccl-ring")
        if slow:
            declined.append("Also, " + slow.replace(RING_ADVICE, ""))
    else:
        for planner, why_not in ((plan_jaccl, mesh_why), (plan_jaccl_ring, ring_why)):
            if why_not:
                declined.append(why_not)
                continue
            try:
                name = "a full mesh" if planner is plan_jaccl else "a ring through all hosts (no full mesh)"
                return planner(topo, envs, f"every host has RDMA and {name} of Thunderbolt 5 links")
            except PlanError as exc:
                declined.append(str(exc).replace(RING_ADVICE, ""))
    if ring_why:
        raise PlanError(f"No backend fits this cabling. {ring_why} RDMA was not possible: {' '.join(declined)}")
    # without RDMA on the hosts, every reason counts; otherwise the last refusal is the closest
    # RDMA came (jaccl-ring after jaccl)
    because = " ".join(declined) if rdma_why else declined[-1]
    return plan_ring(topo, envs, f"ring (TCP over Thunderbolt), because {because}")
