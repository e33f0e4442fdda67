"""A self-contained SVG picture of a topology: hosts as boxes, cables coloured by speed.

Missing mesh links are dashed red, machines outside the host list dashed grey.
The widget embeds the string as is, so everything (styles, legend) is inline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from .cabling import Cabling
from .model import Cable, speed_text
from .render_dot import foreign_label


BOX_W, BOX_H = 150, 50
FOREIGN_W, FOREIGN_H = 150, 44
MARGIN = 30
FONT = "-apple-system, 'Helvetica Neue', Helvetica, Arial, sans-serif"
MISSING = "#dc2626"
FOREIGN = "#9ca3af"
# (minimum Gb/s, colour, legend text), fastest first
SPEEDS = [
    (80.0, "#2563eb", "Thunderbolt 5 (80 Gb/s+)"),
    (40.0, "#f59e0b", "Thunderbolt 4 (40 Gb/s)"),
    (0.1, "#a855f7", "slower than 40 Gb/s"),
]
UNKNOWN = "#6b7280"


def cable_colour(gbps: float | None) -> str:
    """Colour of a cable by link speed (hence Thunderbolt generation)."""
    if gbps is None:
        return UNKNOWN
    return next((colour for floor, colour, _ in SPEEDS if gbps >= floor), UNKNOWN)


@dataclass(frozen=True)
class Point:
    x: float
    y: float

    def __add__(self, o: Point) -> Point:
        return Point(self.x + o.x, self.y + o.y)

    def __sub__(self, o: Point) -> Point:
        return Point(self.x - o.x, self.y - o.y)

    def scale(self, k: float) -> Point:
        return Point(self.x * k, self.y * k)

    def length(self) -> float:
        return math.hypot(self.x, self.y) or 1.0

    def unit(self) -> Point:
        return self.scale(1 / self.length())


def host_positions(n: int) -> list[Point]:
    """Hosts on a circle, first at the top left, clockwise; flat top for even counts."""
    if n == 1:
        return [Point(0, 0)]
    rx = max(220.0, n * 60.0)
    ry = rx * (0.65 if n > 2 else 1.0)
    start = -90.0 - (180.0 / n if n % 2 == 0 else 0.0)
    angles = [math.radians(start + 360.0 * i / n) for i in range(n)]
    return [Point(rx * math.cos(a), ry * math.sin(a)) for a in angles]


def border_point(centre: Point, towards: Point, w: float, h: float) -> Point:
    """Where the segment from a box centre towards `towards` leaves the box."""
    d = towards - centre
    tx = (w / 2) / abs(d.x) if d.x else math.inf
    ty = (h / 2) / abs(d.y) if d.y else math.inf
    return centre + d.scale(min(tx, ty, 1.0))


def _text(p: Point, text: str, size: int = 11, fill: str = "#1f2937", weight: str = "normal",
          anchor: str = "middle", halo: bool = False) -> str:
    style = ' stroke="#ffffff" stroke-width="3" paint-order="stroke"' if halo else ""
    return (f'<text x="{p.x:.1f}" y="{p.y:.1f}" font-size="{size}" fill="{fill}" font-weight="{weight}" '
            f'text-anchor="{anchor}" dominant-baseline="middle"{style}>{escape(text)}</text>')


def _line(a: Point, b: Point, colour: str, width: float = 3, dash: str | None = None, opacity: float = 1) -> str:
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    op = f' stroke-opacity="{opacity}"' if opacity < 1 else ""
    return (f'<line x1="{a.x:.1f}" y1="{a.y:.1f}" x2="{b.x:.1f}" y2="{b.y:.1f}" stroke="{colour}" '
            f'stroke-width="{width}" stroke-linecap="round"{dash_attr}{op}/>')


def _box(c: Point, w: float, h: float, stroke: str, fill: str, dash: str | None = None) -> str:
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<rect x="{c.x - w / 2:.1f}" y="{c.y - h / 2:.1f}" width="{w}" height="{h}" rx="8" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"{dash_attr}/>')


def _cable(topo: Cabling, cable: Cable, a: Point, b: Point, offset: float) -> list[str]:
    """One cable between two host centres, shifted sideways by `offset` when a pair has several."""
    assert cable.b is not None
    normal = Point(-(b - a).y, (b - a).x).unit().scale(offset)
    a2, b2 = a + normal, b + normal
    pa, pb = border_point(a2, b2, BOX_W, BOX_H), border_point(b2, a2, BOX_W, BOX_H)
    colour = cable_colour(cable.gbps)
    along = (pb - pa).unit()
    tip = f"{topo.names[cable.a.host]} {cable.a.iface} — {topo.names[cable.b.host]} {cable.b.iface}, {speed_text(cable.gbps)}"
    if cable.via:
        tip += f", through {', '.join(cable.via)}"
    out = [f"<g><title>{escape(tip)}</title>", _line(pa, pb, colour)]
    out.append(_text(pa + along.scale(22), cable.a.iface, 10, "#374151", halo=True))
    out.append(_text(pb - along.scale(22), cable.b.iface, 10, "#374151", halo=True))
    mid = (pa + pb).scale(0.5)
    if cable.via:
        out.append(f'<rect x="{mid.x - 7:.1f}" y="{mid.y - 7:.1f}" width="14" height="14" rx="3" '
                   f'fill="#ffffff" stroke="{colour}" stroke-width="2" transform="rotate(45 {mid.x:.1f} {mid.y:.1f})"/>')
        out.append(_text(mid + Point(0, 16), f"hub: {cable.via[0]}", 9, "#374151", halo=True))
    elif not cable.rdma_capable:  # Thunderbolt 5 is the norm; label only what is slower or unknown
        out.append(_text(mid, speed_text(cable.gbps), 10, colour, "bold", halo=True))
    out.append("</g>")
    return out


def _host(topo: Cabling, i: int, c: Point) -> list[str]:
    host = topo.hosts[i]
    rdma = host.rdma.enabled if host.rdma else False
    sub = " · ".join(x for x in (host.machine, "RDMA" if rdma else "no RDMA") if x)
    tip = f"{host.name}" + (f", {host.ip}" if host.ip else "") + f", {len(host.ports)} Thunderbolt ports"
    return [
        f"<g><title>{escape(tip)}</title>",
        _box(c, BOX_W, BOX_H, "#334155", "#f8fafc"),
        _text(c + Point(0, -8), host.name, 13, "#0f172a", "bold"),
        _text(c + Point(0, 11), sub, 10, "#16a34a" if rdma else "#64748b"),
        "</g>",
    ]


def _legend(top: float, left: float) -> tuple[list[str], float]:
    items = [(colour, None, text) for _, colour, text in SPEEDS[:2]]
    items += [(UNKNOWN, None, "unknown speed"), (MISSING, "6 4", "missing for a full mesh"),
              (FOREIGN, "6 4", "machine not in the host list")]
    out, x = [], left
    for colour, dash, text in items:
        out.append(_line(Point(x, top), Point(x + 22, top), colour, 3, dash))
        out.append(_text(Point(x + 28, top), text, 10, "#374151", anchor="start"))
        x += 44 + 5.2 * len(text)
    return out, x - left


def layout(topo: Cabling) -> list[Point]:
    """Host centres: around a circle, in ring order when a full ring exists (no crossings)."""
    n = len(topo.hosts)
    ring = topo.full_ring()
    order = list(ring.nodes) if ring else list(range(n))
    spots = host_positions(n)
    pos = [Point(0, 0)] * n
    for spot, host in zip(spots, order):
        pos[host] = spot
    return pos


def to_svg(topo: Cabling, show_missing: bool | None = None) -> str:
    """Render the topology as one `<svg>` string (no external resources).

    Missing mesh links are drawn when `show_missing`, by default only when there are few of them.
    """
    n = len(topo.hosts)
    pos = layout(topo)
    body: list[str] = []
    missing = topo.missing_pairs()
    if show_missing is None:
        show_missing = len(missing) <= max(2, n // 2)
    if show_missing:
        for i, j in missing:
            body.append(f"<g><title>{escape(f'no cable between {topo.names[i]} and {topo.names[j]}')}</title>"
                        + _line(pos[i], pos[j], MISSING, 1.5, "6 4", 0.7) + "</g>")
    pairs: dict[tuple[int, int], list[Cable]] = {}
    for c in topo.local_cables:
        assert c.b is not None
        pairs.setdefault((min(c.a.host, c.b.host), max(c.a.host, c.b.host)), []).append(c)
    for (i, j), cables in pairs.items():
        for k, cable in enumerate(cables):
            a, b = (pos[cable.a.host], pos[cable.b.host]) if cable.b is not None else (pos[i], pos[j])
            body += _cable(topo, cable, a, b, (k - (len(cables) - 1) / 2) * 16)
    foreign_boxes = _foreign(topo, pos, body)
    for i in range(n):
        body += _host(topo, i, pos[i])
    # bounds of everything placed, then a legend underneath
    xs = [p.x for p in pos] + [p.x for p in foreign_boxes]
    ys = [p.y for p in pos] + [p.y for p in foreign_boxes]
    left, right = min(xs) - BOX_W / 2 - MARGIN, max(xs) + BOX_W / 2 + MARGIN
    top, bottom = min(ys) - BOX_H / 2 - MARGIN - 20, max(ys) + BOX_H / 2 + MARGIN
    legend, legend_w = _legend(bottom + 10, left + MARGIN)
    right = max(right, left + legend_w + 2 * MARGIN)
    height = bottom + 30 - top
    summary = _summary(topo)
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="{left:.0f} {top:.0f} {right - left:.0f} {height:.0f}" '
            f'width="{right - left:.0f}" height="{height:.0f}" font-family="{FONT}" role="img">'
            f"<title>{escape(summary)}</title>"
            f'<rect x="{left:.0f}" y="{top:.0f}" width="{right - left:.0f}" height="{height:.0f}" fill="#ffffff"/>')
    title = _text(Point(left + MARGIN, top + 18), summary, 12, "#334155", "bold", anchor="start")
    return "\n".join([head, title, *body, '<g class="legend">', *legend, "</g>", "</svg>"]) + "\n"


def foreign_groups(topo: Cabling) -> list[list[Cable]]:
    """Cables to machines outside the host list, one group per machine (port UUID), in first-seen order."""
    groups: dict[str, list[Cable]] = {}
    for k, cable in enumerate(topo.foreign_cables):
        groups.setdefault(cable.foreign.uuid if cable.foreign else f"cable{k}", []).append(cable)
    return list(groups.values())


def _foreign(topo: Cabling, pos: list[Point], body: list[str]) -> list[Point]:
    """Draw machines outside the host list, pushed outwards from the hosts cabled to them; return their centres."""
    centres = []
    count: dict[int, int] = {}
    for cables in foreign_groups(topo):
        hosts = list(dict.fromkeys(c.a.host for c in cables))
        anchor = Point(sum(pos[h].x for h in hosts) / len(hosts), sum(pos[h].y for h in hosts) / len(hosts))
        k = count.get(hosts[0], 0)
        count[hosts[0]] = k + 1
        out = anchor.unit() if len(pos) > 1 and math.hypot(anchor.x, anchor.y) >= 1 else Point(0, 1)
        side = Point(-out.y, out.x).scale(k * (FOREIGN_H + 12))
        c = anchor + out.scale(BOX_W + 40) + side
        centres.append(c)
        name = foreign_label(cables[0])
        for cable in cables:
            h = cable.a.host
            pa = border_point(pos[h], c, BOX_W, BOX_H)
            pb = border_point(c, pos[h], FOREIGN_W, FOREIGN_H)
            tip = f"{topo.names[h]} {cable.a.iface} is cabled to {name}, which is not in the host list"
            body += [f"<g><title>{escape(tip)}</title>", _line(pa, pb, FOREIGN, 2, "6 4"),
                     _text(pa + (pb - pa).unit().scale(22), cable.a.iface, 10, "#6b7280", halo=True), "</g>"]
        body += [f"<g><title>{escape(name + ', not in the host list')}</title>",
                 _box(c, FOREIGN_W, FOREIGN_H, FOREIGN, "#f9fafb", "6 4"),
                 _text(c + Point(0, -7), name, 11, "#4b5563"),
                 _text(c + Point(0, 10), "not in host list", 9, "#9ca3af"), "</g>"]
    return centres


def _summary(topo: Cabling) -> str:
    n, cables = len(topo.hosts), len(topo.local_cables)
    missing = len(topo.missing_pairs())
    if n > 1 and not missing:
        shape = "full mesh"
    else:
        shape = ("ring" if topo.full_ring() else "no ring through all hosts") + f", {missing} pairs not cabled"
    return f"{n} hosts · {cables} cable{'s' if cables != 1 else ''} · {shape}"
