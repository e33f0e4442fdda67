"""Where the topology widget draws its lines and labels: computed here, drawn as given by topology.js.

Every label sits beside its line, clear of all lines, host boxes, hub marks and other labels
(`topology.labels.place`); a test checks that geometrically for every recorded cluster.
"""

from __future__ import annotations

from typing import Any

from mlx_jupyter.topology.labels import Box, Label, Scene, Segment, place, text_box
from mlx_jupyter.topology.render_svg import (BOX_H, BOX_W, FOREIGN_H, FOREIGN_W, PARALLEL_GAP, Point, border_point,
                                             cable_ends)

IFACE_SIZE, NOTE_SIZE = 10, 10
HUB_HALF = 10.0  # the hub mark: a 14 px square turned 45 degrees


def _seg(a: Point, b: Point) -> Segment:
    return Segment(a.x, a.y, b.x, b.y)


def _rev(s: Segment) -> Segment:
    return Segment(s.x2, s.y2, s.x1, s.y1)


def _centre_texts(c: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The labels in the middle of a cable: (text, class, bold)."""
    out = []
    ck = c.get("check")
    if c["via"]:
        out.append((f"hub: {c['via'][0]}", "mlxj-note", False))
    elif c["one_sided"]:
        out.append(("one-sided", "mlxj-note mlxj-warn-text", True))
    elif not c["rdma_capable"] and not ck:
        out.append((c["speed"], "mlxj-speed", True))
    if ck and ck.get("label"):
        out.append((ck["label"], "mlxj-speed mlxj-check-label", True))
    return out


def lay_out(model: dict[str, Any]) -> None:
    """Add `line` and `labels` to each cable, `missing_lines` and `extent` to the model (in place)."""
    hosts = model["hosts"]
    pos = [Point(h["x"], h["y"]) for h in hosts]
    scene = Scene(boxes=[Box(p.x, p.y, BOX_W / 2, BOX_H / 2) for p in pos])
    pairs: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for c in model["cables"]:
        if c["b"] is not None:
            pairs.setdefault((min(c["a"], c["b"]), max(c["a"], c["b"])), []).append(c)
    centre: list[Label] = []
    ends: list[Label] = []
    for cables in pairs.values():
        for k, c in enumerate(cables):
            pa, pb = cable_ends(pos[c["a"]], pos[c["b"]], (k - (len(cables) - 1) / 2) * PARALLEL_GAP)
            seg = _seg(pa, pb)
            scene.segments.append(seg)
            c["line"] = [round(v, 1) for v in (pa.x, pa.y, pb.x, pb.y)]
            c["_labels"] = []
            if c["via"]:
                mid = (pa + pb).scale(0.5)
                scene.boxes.append(Box(mid.x, mid.y, HUB_HALF, HUB_HALF))
            for text, cls, bold in _centre_texts(c):
                lb = Label(text, NOTE_SIZE, seg, 0.5, bold, cls=cls)
                centre.append(lb)
                c["_labels"].append(lb)
            for text, s in ((c["a_iface"], seg), (c["b_iface"], _rev(seg))):
                lb = Label(text, IFACE_SIZE, s, end_gap=2.0, cls="mlxj-iface")
                ends.append(lb)
                c["_labels"].append(lb)
    for c in model["cables"]:
        if c["b"] is None and "x" in c:
            far = Point(c["x"], c["y"])
            pa = border_point(pos[c["a"]], far, BOX_W, BOX_H)
            pb = border_point(far, pos[c["a"]], FOREIGN_W, FOREIGN_H)
            seg = _seg(pa, pb)
            scene.segments.append(seg)
            scene.boxes.append(Box(far.x, far.y, FOREIGN_W / 2, FOREIGN_H / 2))
            c["line"] = [round(v, 1) for v in (pa.x, pa.y, pb.x, pb.y)]
            lb = Label(c["a_iface"], IFACE_SIZE, seg, end_gap=2.0, cls="mlxj-iface")
            ends.append(lb)
            c["_labels"] = [lb]
    missing = []
    for i, j in model["missing"]:
        pa, pb = border_point(pos[i], pos[j], BOX_W, BOX_H), border_point(pos[j], pos[i], BOX_W, BOX_H)
        seg = _seg(pa, pb)
        scene.segments.append(seg)
        missing.append((i, j, seg, Label("missing", NOTE_SIZE, seg, 0.5, True, cls="mlxj-missing-label")))
    place(centre + ends + [m[3] for m in missing], scene)
    boxes: list[Box] = []
    for c in model["cables"]:
        labels = c.pop("_labels", [])
        c["labels"] = [_label_json(lb, boxes) for lb in labels]
    model["missing_lines"] = [{"a": i, "b": j, "line": [round(v, 1) for v in (s.x1, s.y1, s.x2, s.y2)],
                               "label": _label_json(lb, boxes)} for i, j, s, lb in missing]
    if boxes:
        model["extent"] = [round(min(b.x - b.hw for b in boxes), 1), round(min(b.y - b.hh for b in boxes), 1),
                           round(max(b.x + b.hw for b in boxes), 1), round(max(b.y + b.hh for b in boxes), 1)]


def _label_json(lb: Label, boxes: list[Box]) -> dict[str, Any]:
    boxes.append(text_box(lb.x, lb.y, lb.text, lb.size, lb.bold))
    return {"text": lb.text, "x": round(lb.x, 1), "y": round(lb.y, 1), "cls": lb.cls, "size": lb.size,
            "bold": lb.bold, "placed": lb.placed}
