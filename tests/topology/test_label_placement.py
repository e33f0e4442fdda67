"""Topology drawings: no label overlaps a line, a box or another label, for every recorded cluster.

Pure geometry, no browser: the boxes of the texts and the line segments are read back from what is drawn
(the SVG of `Topology.to_svg()`, parsed; the widget's JSON model, whose positions topology.js draws as given),
with text sized by `labels.text_box` (a wide estimate of the sans-serif advance).
"""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

import pytest

from mlx_jupyter.topology import Topology
from mlx_jupyter.topology.labels import Box, Segment, segment_hits_box, text_box
from mlx_jupyter.topology.render_svg import BOX_H, BOX_W, FOREIGN_H, FOREIGN_W, to_svg

from tb_fixtures import FIXTURES, SCENARIOS

SVG = "{http://www.w3.org/2000/svg}"
STROKE = 1.5  # half of the widest cable line


def check_label(box: Box, what: str, segments: list[tuple[Segment, str]], rects: list[tuple[Box, str]]) -> None:
    for seg, name in segments:
        assert not segment_hits_box(seg, box.grown(STROKE)), f"{what} overlaps the line of {name}"
    for rect, name in rects:
        assert not box.overlaps(rect), f"{what} overlaps {name}"


def no_two_overlap(labels: list[tuple[Box, str]]) -> None:
    for (a, na), (b, nb) in itertools.combinations(labels, 2):
        assert not a.overlaps(b), f"{na} overlaps {nb}"


def all_checked(topo: Topology) -> dict[int, dict]:
    """A cable check's annotations on every cable between listed hosts (the widest label a check writes)."""
    return {k: {"state": "ok", "label": "55.8/57.0 Gb/s · 0.08 ms", "flags": [], "error": None}
            for k, c in enumerate(topo.cables) if c.b is not None}


# -- the widget's model (what topology.js draws) -------------------------------------------------


@pytest.mark.parametrize("checked", [False, True], ids=["plain", "after-check"])
@pytest.mark.parametrize("case", SCENARIOS)
def test_widget_labels_clear(case, checked):
    from mlx_jupyter.widgets.topology_model import topology_model

    topo = Topology.from_recordings(FIXTURES / case)
    m = topology_model(topo, checks=all_checked(topo) if checked else None)
    names = [h["name"] for h in m["hosts"]]
    segments, rects, labels = [], [], []
    rects += [(Box(h["x"], h["y"], BOX_W / 2, BOX_H / 2), f"host {h['name']}") for h in m["hosts"]]
    for c in m["cables"]:
        name = f"{names[c['a']]} {c['a_iface']} cable"
        segments.append((Segment(*c["line"]), name))
        if c["b"] is None:
            rects.append((Box(c["x"], c["y"], FOREIGN_W / 2, FOREIGN_H / 2), f"the machine beyond {name}"))
        elif c["via"]:
            x1, y1, x2, y2 = c["line"]
            rects.append((Box((x1 + x2) / 2, (y1 + y2) / 2, 10, 10), f"the hub mark of {name}"))
        labels += [(l, f"label {l['text']!r} of {name}") for l in c["labels"]]
    for ml in m["missing_lines"]:
        segments.append((Segment(*ml["line"]), f"missing {names[ml['a']]}-{names[ml['b']]}"))
        labels.append((ml["label"], f"label 'missing' of {names[ml['a']]}-{names[ml['b']]}"))
    assert labels, "nothing labelled"
    expected = sum(2 if c["b"] is not None else 1 for c in m["cables"])
    assert sum(l["cls"] == "mlxj-iface" for l, _ in labels) == expected  # every interface named
    if checked:
        assert sum("mlxj-check-label" in l["cls"] for l, _ in labels) == len(all_checked(topo))
    boxes = [(text_box(l["x"], l["y"], l["text"], l["size"], l["bold"]), what) for l, what in labels]
    for box, what in boxes:
        check_label(box, f"{case}: {what}", segments, rects)
    no_two_overlap([(b, f"{case}: {w}") for b, w in boxes])


def test_check_label_beside_a_horizontal_cable_not_on_the_names():
    """The reported case: '55.8/57.0 Gb/s · 0.08 ms' ran into 'en5' and 'en4' on a short horizontal cable."""
    from mlx_jupyter.widgets.topology_model import topology_model

    topo = Topology.from_recordings(FIXTURES / "four-macs-ring-only")
    m = topology_model(topo, checks=all_checked(topo))
    flat = [c for c in m["cables"] if c["b"] is not None and abs(c["line"][1] - c["line"][3]) < 1]
    assert flat, "the fixture has a horizontal cable"
    for c in flat:
        y = c["line"][1]
        check = next(l for l in c["labels"] if "mlxj-check-label" in l["cls"])
        assert abs(check["y"] - y) >= 6.5 + 3  # beside the line, not on it


# -- the static SVG (Topology.to_svg) -----------------------------------------------------------


def _float(el: ET.Element, name: str) -> float:
    return float(el.get(name, "0"))


def svg_geometry(svg: str) -> tuple[list[tuple[Segment, str]], list[tuple[Box, str]], list[tuple[Box, str]]]:
    """Lines, rectangles and text boxes of the drawing, the legend left out."""
    root = ET.fromstring(svg)
    legend = {id(e) for g in root.iter(f"{SVG}g") if g.get("class") == "legend" for e in g.iter()}
    segments, rects, texts = [], [], []
    for el in root.iter():
        if id(el) in legend:
            continue
        if el.tag == f"{SVG}line":
            seg = Segment(*(_float(el, k) for k in ("x1", "y1", "x2", "y2")))
            segments.append((seg, f"line ({seg.x1:.0f},{seg.y1:.0f})-({seg.x2:.0f},{seg.y2:.0f})"))
        elif el.tag == f"{SVG}rect" and el.get("fill") != "#ffffff" or el.tag == f"{SVG}rect" and el.get("transform"):
            w, h = _float(el, "width"), _float(el, "height")
            half = max(w, h) * 0.71 if el.get("transform") else None  # a hub mark: a square turned 45 degrees
            x, y = _float(el, "x") + w / 2, _float(el, "y") + h / 2
            rects.append((Box(x, y, half or w / 2, half or h / 2), f"box at ({x:.0f},{y:.0f})"))
        elif el.tag == f"{SVG}text":
            size, text = _float(el, "font-size"), el.text or ""
            box = text_box(_float(el, "x"), _float(el, "y"), text, size, el.get("font-weight") == "bold")
            if el.get("text-anchor") == "start":
                box = Box(box.x + box.hw, box.y, box.hw, box.hh)
            texts.append((box, f"text {text!r}"))
    return segments, rects, texts


@pytest.mark.parametrize("missing", [None, True], ids=["default", "all-missing-drawn"])
@pytest.mark.parametrize("case", SCENARIOS)
def test_svg_labels_clear(case, missing):
    topo = Topology.from_recordings(FIXTURES / case)
    segments, rects, texts = svg_geometry(to_svg(topo, show_missing=missing))
    assert texts and segments
    for box, what in texts:
        inside = [(r, n) for r, n in rects if abs(box.x - r.x) <= r.hw and abs(box.y - r.y) <= r.hh]
        outside = [(r, n) for r, n in rects if (r, n) not in inside]
        check_label(box, f"{case}: {what}", segments, outside)
    no_two_overlap([(b, f"{case}: {w}") for b, w in texts])
