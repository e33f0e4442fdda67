"""GraphViz DOT text of a topology: every cable once, whichever side reported it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .model import natural_key

if TYPE_CHECKING:
    from .core import Topology


def node_id(i: int) -> str:
    """a, b, ..., z, aa, ab, ... (bijective base 26)."""
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = chr(97 + r) + out
    return out


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(topo: Topology, show_foreign: bool = True) -> str:
    """Undirected graph, rectangle nodes labelled with ssh names, edges labelled `ifaceA/ifaceB`."""
    lines = ["graph G {", "  node [shape=rectangle];"]
    lines += [f"  {node_id(i)} [label={quote(name)}];" for i, name in enumerate(topo.names)]
    edges = []
    for c in topo.local_cables:
        assert c.b is not None
        lo, hi = (c.a, c.b) if c.a.host <= c.b.host else (c.b, c.a)
        label = f"{lo.iface}/{hi.iface}"
        edges.append(((lo.host, natural_key(lo.iface)), f"  {node_id(lo.host)} -- {node_id(hi.host)} [label={quote(label)}]"))
    lines += [text for _, text in sorted(edges, key=lambda e: e[0])]
    if show_foreign:
        for k, c in enumerate(topo.foreign_cables, 1):
            peer = c.foreign
            who = (peer.name or "unlisted machine") if peer else "unlisted machine"
            if peer and peer.model:
                who += f" ({peer.model})"
            fid = f"foreign{k}"
            lines.append(f"  {fid} [label={quote(who + chr(10) + 'not in host list')}, style=dashed];")
            lines.append(f"  {node_id(c.a.host)} -- {fid} [label={quote(c.a.iface)}, style=dashed]")
    lines.append("}")
    return "\n".join(lines) + "\n"
