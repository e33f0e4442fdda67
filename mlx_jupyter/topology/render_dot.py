"""GraphViz DOT text of a topology: every cable once, whichever side reported it."""

from __future__ import annotations


from .cabling import Cabling
from .model import Cable, natural_key



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


def foreign_label(cable: Cable) -> str:
    """`MacBook Pro (Mac17,7)`: what the near end reports about a machine outside the host list."""
    peer = cable.foreign
    who = (peer.name or "unlisted machine") if peer else "unlisted machine"
    return who + (f" ({peer.model})" if peer and peer.model else "")


def to_dot(topo: Cabling, show_foreign: bool = True) -> str:
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
        nodes: dict[str, str] = {}  # one node per foreign machine (port UUID), however many hosts reach it
        for c in topo.foreign_cables:
            key = c.foreign.uuid if c.foreign else f"cable{len(nodes)}"
            if key not in nodes:
                nodes[key] = fid = f"foreign{len(nodes) + 1}"
                lines.append(f"  {fid} [label={quote(foreign_label(c) + chr(10) + 'not in host list')}, style=dashed];")
            lines.append(f"  {node_id(c.a.host)} -- {nodes[key]} [label={quote(c.a.iface)}, style=dashed]")
    lines.append("}")
    return "\n".join(lines) + "\n"
