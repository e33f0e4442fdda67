"""The JSON model a `TopologyWidget` draws: hosts, cables, marks, the backend choice and the address plan.

Pure: a `Topology` in, a JSON-able dict out. Positions come from the topology's own
SVG layout (`render_svg.layout`), so the widget and `Topology.to_svg()` place hosts alike.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mlx_jupyter.topology import PlanError, Topology
from mlx_jupyter.topology.model import Cable, speed_text
from mlx_jupyter.topology.render_svg import BOX_W, FOREIGN_H, Point, cable_colour, layout
from mlx_jupyter.widgets.topology_layout import lay_out


def seen_from(topo: Topology, cable: Cable) -> list[int]:
    """The hosts (indices) whose port reports the other end of this cable; both for a healthy cable."""
    if cable.b is None:
        return [cable.a.host]
    ends = ((cable.a, cable.b), (cable.b, cable.a))
    out = []
    for near, far in ends:
        port = topo.hosts[near.host].port(near.iface)
        if any(p.uuid == topo.hosts[far.host].port(far.iface).uuid for p in port.peers):
            out.append(near.host)
    return out


def _host(topo: Topology, i: int, p: Point) -> dict[str, Any]:
    h = topo.hosts[i]
    return {
        "index": i, "name": h.name, "ip": h.ip, "machine": h.machine, "sudo": h.sudo,
        "rdma": "unknown" if h.rdma is None else h.rdma.state, "ports": len(h.ports),
        "x": round(p.x, 1), "y": round(p.y, 1),
    }


def _cable(topo: Topology, k: int, c: Cable, addresses: dict[int, tuple[str, str]]) -> dict[str, Any]:
    seen = seen_from(topo, c)
    out: dict[str, Any] = {
        "id": k, "a": c.a.host, "a_iface": c.a.iface, "b": None if c.b is None else c.b.host,
        "b_iface": None if c.b is None else c.b.iface, "gbps": c.gbps, "speed": speed_text(c.gbps),
        "generation": c.generation, "kind": c.kind, "via": list(c.via), "rdma_capable": c.rdma_capable,
        "colour": cable_colour(c.gbps), "one_sided": c.b is not None and len(seen) < 2,
        "seen_from": [topo.names[i] for i in seen], "foreign": None, "addresses": list(addresses[id(c)]) if id(c) in addresses else None,
    }
    if c.foreign is not None:
        out["foreign"] = {"name": c.foreign.name or "unlisted machine", "model": c.foreign.model}
    return out


def _foreign_positions(topo: Topology, pos: list[Point], cables: list[dict[str, Any]]) -> None:
    """Place machines outside the host list outwards from their host (as the SVG renderer does)."""
    count: dict[int, int] = {}
    for c in cables:
        if c["b"] is not None:
            continue
        h = c["a"]
        k = count.get(h, 0)
        count[h] = k + 1
        out = pos[h].unit() if len(pos) > 1 else Point(0, 1)
        spot = pos[h] + out.scale(BOX_W + 40) + Point(-out.y, out.x).scale(k * (FOREIGN_H + 12))
        c["x"], c["y"] = round(spot.x, 1), round(spot.y, 1)


def backend_model(topo: Topology, backend: str | None, envs: Sequence[str] = ()) -> dict[str, Any]:
    """The chosen (or requested) backend with its reason, or why none fits."""
    try:
        choice = topo.choose_backend(backend, envs)
    except PlanError as exc:
        return {"name": None, "reason": "", "error": str(exc), "ring": None, "hostfile": None}
    ring = [topo.names[i] for i in choice.ring.nodes] if choice.ring else None
    return {"name": choice.backend, "reason": choice.reason, "error": None, "ring": ring, "hostfile": choice.hostfile,
            "warnings": list(choice.warnings), "note": fast_synch_note(choice.hostfile.get("envs", []))}


#: Why MLX_METAL_FAST_SYNCH matters, shown with the backend choice.
FAST_SYNCH = ("MLX_METAL_FAST_SYNCH=1 makes MLX on a Mac synchronise the CPU with the GPU by polling instead "
              "of waiting for Metal's completion event: much lower latency per collective, which RDMA (jaccl) "
              "and small ring messages otherwise lose")


def fast_synch_note(envs: Sequence[str]) -> str:
    """The backend note about ``MLX_METAL_FAST_SYNCH``: set by the hostfile's envs, or how to set it."""
    if "MLX_METAL_FAST_SYNCH=1" in envs:
        return f"{FAST_SYNCH}; this hostfile sets it for every rank"
    return f"{FAST_SYNCH}; add it to the hostfile's envs (mlx-jupyter config --env MLX_METAL_FAST_SYNCH=1)"


def address_plan(topo: Topology) -> list[dict[str, str]]:
    """One row per addressed cable: both ends' host, interface and address."""
    rows = []
    for lk in topo.links():
        c = lk.cable
        assert c.b is not None
        rows.append({"a": topo.names[c.a.host], "a_iface": c.a.iface, "a_ip": lk.a_ip,
                     "b": topo.names[c.b.host], "b_iface": c.b.iface, "b_ip": lk.b_ip})
    return rows


def summary(topo: Topology) -> str:
    """`4 hosts · 5 cables · ring, 1 pair not cabled`."""
    n, cables, missing = len(topo.hosts), len(topo.local_cables), len(topo.missing_pairs())
    shape = "full mesh" if n > 1 and not missing else (
        ("ring" if topo.full_ring() else "no ring through all hosts") + f", {missing} pair{'s' if missing != 1 else ''} not cabled")
    return f"{n} host{'s' if n != 1 else ''} · {cables} cable{'s' if cables != 1 else ''} · {shape}"


def topology_model(topo: Topology, backend: str | None = None, envs: Sequence[str] = (),
                   checks: Mapping[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Everything the widget shows, as JSON-able data; `checks` (cable id -> annotation) from a cable check."""
    pos = layout(topo) if topo.hosts else []
    addresses = {id(lk.cable): (lk.a_ip, lk.b_ip) for lk in topo.links()}
    cables = [_cable(topo, k, c, addresses) for k, c in enumerate(topo.cables)]
    for c in cables:
        c["check"] = (checks or {}).get(c["id"])
    _foreign_positions(topo, pos, cables)
    warnings = list(topo.warnings)
    for c in cables:
        if c["one_sided"]:
            a, b = topo.names[c["a"]], topo.names[c["b"]]
            only = c["seen_from"][0] if c["seen_from"] else "neither end"
            warnings.append(f"the cable {a} {c['a_iface']} <-> {b} {c['b_iface']} is seen only from {only}: "
                            "reseat it, or check that both Macs are awake")
    model = {
        "summary": summary(topo),
        "hosts": [_host(topo, i, p) for i, p in enumerate(pos)],
        "cables": cables,
        "missing": [[i, j] for i, j in topo.missing_pairs()],
        "backend": backend_model(topo, backend, envs),
        "warnings": warnings,
        "plan": address_plan(topo),
        "setup": topo.setup_commands(),
    }
    lay_out(model)
    return model
