"""A self-contained SVG picture of a topology: hosts as boxes, cables coloured by speed.

Missing mesh links are dashed red, machines outside the host list dashed grey.
The widget embeds the string as is, so everything (styles, legend) is inline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from .cabling import Cabling
from .labels import Box, Label, Scene, Segment, place
from .model import Cable, speed_text
from .render_dot import foreign_label


BOX_W, BOX_H = 150, 50
FOREIGN_W, FOREIGN_H = 150, 44
MARGIN = 30
PARALLEL_GAP = 16  # between the cables of one pair of hosts
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


def cable_ends(a: Point, b: Point, offset: float) -> tuple[Point, Point]:
    """A cable's ends on the two host boxes, shifted sideways by `offset` when a pair has several cables."""
    normal = Point(-(b - a).y, (b - a).x).unit().scale(offset)
    a2, b2 = a + normal, b + normal
    return border_point(a2, b2, BOX_W, BOX_H), border_point(b2, a2, BOX_W, BOX_H)


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


def _cable(topo: Cabling, cable: Cable, pa: Point, pb: Point, labels: list[Label]) -> list[str]:
    """One cable from `pa` to `pb` (on the host boxes), with its placed labels."""
    assert cable.b is not None
    colour = cable_colour(cable.gbps)
    tip = f"{topo.names[cable.a.host]} {cable.a.iface} — {topo.names[cable.b.host]} {cable.b.iface}, {speed_text(cable.gbps)}"
    if cable.via:
        tip += f", through {', '.join(cable.via)}"
    out = [f"<g><title>{escape(tip)}</title>", _line(pa, pb, colour)]
    mid = (pa + pb).scale(0.5)
    if cable.via:
        out.append(f'<rect x="{mid.x - 7:.1f}" y="{mid.y - 7:.1f}" width="14" height="14" rx="3" '
                   f'fill="#ffffff" stroke="{colour}" stroke-width="2" transform="rotate(45 {mid.x:.1f} {mid.y:.1f})"/>')
    out += [_placed(lb, colour if lb.cls == "speed" else "#374151") for lb in labels]
    out.append("</g>")
    return out


def _placed(lb: Label, fill: str) -> str:
    return _text(Point(lb.x, lb.y), lb.text, int(lb.size), fill, "bold" if lb.bold else "normal", halo=True)


def _cable_labels(cable: Cable, seg: Segment) -> tuple[list[Label], list[Label]]:
    """A cable's middle label (hub, or a speed other than Thunderbolt 5's) and its two interface names."""
    mid = []
    if cable.via:
        mid.append(Label(f"hub: {cable.via[0]}", 9, seg, 0.5, cls="hub"))
    elif not cable.rdma_capable:  # Thunderbolt 5 is the norm; label only what is slower or unknown
        mid.append(Label(speed_text(cable.gbps), 10, seg, 0.5, True, cls="speed"))
    assert cable.b is not None
    ends = [Label(cable.a.iface, 10, seg, end_gap=2.0),
            Label(cable.b.iface, 10, Segment(seg.x2, seg.y2, seg.x1, seg.y1), end_gap=2.0)]
    return mid, ends


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
    items: list[tuple[str, str | None, str]] = [(colour, None, text) for _, colour, text in SPEEDS[:2]]
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
    Labels sit beside their lines, clear of every line, box and other label (`labels.place`).
    """
    n = len(topo.hosts)
    pos = layout(topo)
    scene = Scene(boxes=[Box(p.x, p.y, BOX_W / 2, BOX_H / 2) for p in pos])
    body: list[str] = []
    missing = topo.missing_pairs()
    if show_missing is None:
        show_missing = len(missing) <= max(2, n // 2)
    if show_missing:
        for i, j in missing:
            pa, pb = border_point(pos[i], pos[j], BOX_W, BOX_H), border_point(pos[j], pos[i], BOX_W, BOX_H)
            scene.segments.append(Segment(pa.x, pa.y, pb.x, pb.y))
            body.append(f"<g><title>{escape(f'no cable between {topo.names[i]} and {topo.names[j]}')}</title>"
                        + _line(pa, pb, MISSING, 1.5, "6 4", 0.7) + "</g>")
    pairs: dict[tuple[int, int], list[Cable]] = {}
    for c in topo.local_cables:
        assert c.b is not None
        pairs.setdefault((min(c.a.host, c.b.host), max(c.a.host, c.b.host)), []).append(c)
    drawn: list[tuple[Cable, Point, Point, list[Label]]] = []
    mids: list[Label] = []
    ends: list[Label] = []
    for cables in pairs.values():
        for k, cable in enumerate(cables):
            assert cable.b is not None
            pa, pb = cable_ends(pos[cable.a.host], pos[cable.b.host], (k - (len(cables) - 1) / 2) * PARALLEL_GAP)
            seg = Segment(pa.x, pa.y, pb.x, pb.y)
            scene.segments.append(seg)
            if cable.via:
                mid = (pa + pb).scale(0.5)
                scene.boxes.append(Box(mid.x, mid.y, 10, 10))
            m, e = _cable_labels(cable, seg)
            mids += m
            ends += e
            drawn.append((cable, pa, pb, m + e))
    foreign = _foreign_layout(topo, pos)
    for centre, outside, _ in foreign:
        scene.boxes.append(Box(centre.x, centre.y, FOREIGN_W / 2, FOREIGN_H / 2))
        for *_, lb in outside:
            scene.segments.append(lb.along)
            ends.append(lb)
    place(mids + ends, scene)
    for cable, pa, pb, labels in drawn:
        body += _cable(topo, cable, pa, pb, labels)
    body += _foreign(topo, foreign)
    for i in range(n):
        body += _host(topo, i, pos[i])
    # bounds of everything placed, then a legend underneath
    xs = [p.x - BOX_W / 2 for p in pos] + [p.x - FOREIGN_W / 2 for p, _, _ in foreign] + [b.x - b.hw for b in scene.labels]
    xe = [p.x + BOX_W / 2 for p in pos] + [p.x + FOREIGN_W / 2 for p, _, _ in foreign] + [b.x + b.hw for b in scene.labels]
    ys = [p.y - BOX_H / 2 for p in pos] + [p.y - FOREIGN_H / 2 for p, _, _ in foreign] + [b.y - b.hh for b in scene.labels]
    ye = [p.y + BOX_H / 2 for p in pos] + [p.y + FOREIGN_H / 2 for p, _, _ in foreign] + [b.y + b.hh for b in scene.labels]
    left, right = min(xs) - MARGIN, max(xe) + MARGIN
    top, bottom = min(ys) - MARGIN - 20, max(ye) + MARGIN
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


ForeignCable = tuple[Cable, Point, Point, Label]


def _foreign_layout(topo: Cabling, pos: list[Point]) -> list[tuple[Point, list[ForeignCable], str]]:
    """Machines outside the host list, pushed outwards from the hosts cabled to them: centre, cables, name."""
    out = []
    count: dict[int, int] = {}
    for cables in foreign_groups(topo):
        hosts = list(dict.fromkeys(c.a.host for c in cables))
        anchor = Point(sum(pos[h].x for h in hosts) / len(hosts), sum(pos[h].y for h in hosts) / len(hosts))
        k = count.get(hosts[0], 0)
        count[hosts[0]] = k + 1
        away = anchor.unit() if len(pos) > 1 and math.hypot(anchor.x, anchor.y) >= 1 else Point(0, 1)
        side = Point(-away.y, away.x).scale(k * (FOREIGN_H + 12))
        c = anchor + away.scale(BOX_W + 40) + side
        lines = []
        for cable in cables:
            pa = border_point(pos[cable.a.host], c, BOX_W, BOX_H)
            pb = border_point(c, pos[cable.a.host], FOREIGN_W, FOREIGN_H)
            lines.append((cable, pa, pb, Label(cable.a.iface, 10, Segment(pa.x, pa.y, pb.x, pb.y), end_gap=2.0)))
        out.append((c, lines, foreign_label(cables[0])))
    return out


def _foreign(topo: Cabling, foreign: list[tuple[Point, list[ForeignCable], str]]) -> list[str]:
    """Draw the machines outside the host list and their (dashed) cables."""
    body: list[str] = []
    for c, lines, name in foreign:
        for cable, pa, pb, lb in lines:
            tip = f"{topo.names[cable.a.host]} {cable.a.iface} is cabled to {name}, which is not in the host list"
            body += [f"<g><title>{escape(tip)}</title>", _line(pa, pb, FOREIGN, 2, "6 4"),
                     _text(Point(lb.x, lb.y), lb.text, 10, "#6b7280", halo=True), "</g>"]
        body += [f"<g><title>{escape(name + ', not in the host list')}</title>",
                 _box(c, FOREIGN_W, FOREIGN_H, FOREIGN, "#f9fafb", "6 4"),
                 _text(c + Point(0, -7), name, 11, "#4b5563"),
                 _text(c + Point(0, 10), "not in host list", 9, "#9ca3af"), "</g>"]
    return body


def _summary(topo: Cabling) -> str:
    n, cables = len(topo.hosts), len(topo.local_cables)
    missing = len(topo.missing_pairs())
    if n > 1 and not missing:
        shape = "full mesh"
    else:
        shape = ("ring" if topo.full_ring() else "no ring through all hosts") + f", {missing} pairs not cabled"
    return f"{n} hosts · {cables} cable{'s' if cables != 1 else ''} · {shape}"
