"""Label placement for the topology drawings: each label beside its line, clear of every line, box and label.

Pure geometry shared by the SVG renderer and the widget's model (which sends the positions to the browser),
so a test can check the result without a browser. Text sizes are estimated on the wide side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Widest average advance of the sans-serif fonts used, in em (Helvetica/Arial run about 0.5-0.55).
EM_NORMAL, EM_BOLD = 0.6, 0.66
LINE_CLEARANCE = 3.0  # from a label's box to the nearest line's centre (3 px lines: 1.5 px of paint, 1.5 of air)


@dataclass(frozen=True)
class Box:
    """An axis-aligned rectangle by its centre and half sizes."""
    x: float
    y: float
    hw: float
    hh: float

    def overlaps(self, o: Box, pad: float = 0.0) -> bool:
        return abs(self.x - o.x) < self.hw + o.hw + pad and abs(self.y - o.y) < self.hh + o.hh + pad

    def grown(self, pad: float) -> Box:
        return Box(self.x, self.y, self.hw + pad, self.hh + pad)


@dataclass(frozen=True)
class Segment:
    x1: float
    y1: float
    x2: float
    y2: float


def text_box(x: float, y: float, text: str, size: float, bold: bool = False) -> Box:
    """The (generous) box of a middle-anchored, middle-baseline text."""
    return Box(x, y, len(text) * size * (EM_BOLD if bold else EM_NORMAL) / 2 + 1, size * 0.65)


def segment_hits_box(s: Segment, b: Box) -> bool:
    """Whether the segment passes through the box (Liang-Barsky clipping)."""
    dx, dy = s.x2 - s.x1, s.y2 - s.y1
    t0, t1 = 0.0, 1.0
    for p, q in ((-dx, s.x1 - (b.x - b.hw)), (dx, (b.x + b.hw) - s.x1),
                 (-dy, s.y1 - (b.y - b.hh)), (dy, (b.y + b.hh) - s.y1)):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
        if t0 > t1:
            return False
    return True


@dataclass
class Label:
    """A text to place beside `along` (a segment), near `prefer` (fraction from its start), or at the line's end."""
    text: str
    size: float
    along: Segment
    prefer: float = 0.5
    bold: bool = False
    end_gap: float | None = None  # set: keep this far (px) from the segment's start (an interface name)
    cls: str = ""
    x: float = 0.0
    y: float = 0.0
    placed: bool = False


@dataclass
class Scene:
    """Everything labels must keep clear of: lines, boxes (hosts, hubs) and labels already placed."""
    segments: list[Segment] = field(default_factory=list)
    boxes: list[Box] = field(default_factory=list)
    labels: list[Box] = field(default_factory=list)

    def free(self, b: Box) -> bool:
        grown = b.grown(LINE_CLEARANCE - 0.01)
        return (not any(segment_hits_box(s, grown) for s in self.segments)
                and not any(b.overlaps(o, 2.0) for o in self.boxes)
                and not any(b.overlaps(o, 1.0) for o in self.labels))


def _candidates(lb: Label) -> list[tuple[float, float]]:
    s = lb.along
    dx, dy = s.x2 - s.x1, s.y2 - s.y1
    length = math.hypot(dx, dy) or 1.0
    ux, uy = dx / length, dy / length
    nx, ny = -uy, ux
    probe = text_box(0, 0, lb.text, lb.size, lb.bold)
    # how far from the line's centre the box's centre must be to clear it, sideways and lengthways
    side = abs(nx) * probe.hw + abs(ny) * probe.hh + LINE_CLEARANCE
    reach = abs(ux) * probe.hw + abs(uy) * probe.hh
    if lb.end_gap is not None:
        starts = [lb.end_gap + reach + 6 * k for k in range(12)]
    else:
        starts = [length * lb.prefer + length * 0.06 * k * sign for k in range(9) for sign in ((1,) if k == 0 else (1, -1))]
    out = []
    for d in starts:
        if not 0 <= d <= length:
            continue
        for push in (0, 8, 16):
            for sgn in (1, -1):
                out.append((s.x1 + ux * d + sgn * nx * (side + push), s.y1 + uy * d + sgn * ny * (side + push)))
    return out


def place(labels: list[Label], scene: Scene) -> list[Label]:
    """Place each label (in order) at its first free candidate; a label with none stays at its best guess, unplaced."""
    for lb in labels:
        spots = _candidates(lb)
        for x, y in spots:
            box = text_box(x, y, lb.text, lb.size, lb.bold)
            if scene.free(box):
                lb.x, lb.y, lb.placed = x, y, True
                break
        else:
            lb.x, lb.y = spots[0] if spots else ((lb.along.x1 + lb.along.x2) / 2, (lb.along.y1 + lb.along.y2) / 2)
        scene.labels.append(text_box(lb.x, lb.y, lb.text, lb.size, lb.bold))
    return labels
