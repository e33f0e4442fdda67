"""The SVG rendering: well-formed, self-contained, with the conventions the widget relies on."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tb_fixtures import FIXTURES, SCENARIOS
from mlx_jupyter.topology import Topology
from mlx_jupyter.topology.render_dot import node_id
from mlx_jupyter.topology.render_svg import FOREIGN, MISSING, cable_colour, to_svg

NS = "{http://www.w3.org/2000/svg}"


def svg_of(case: str, **kw) -> ET.Element:
    return ET.fromstring(to_svg(Topology.from_recordings(FIXTURES / case), **kw))


@pytest.mark.parametrize("case", SCENARIOS)
def test_svg_is_wellformed_and_names_every_host(case):
    root = svg_of(case)
    assert root.tag == f"{NS}svg"
    texts = {t.text for t in root.iter(f"{NS}text")}
    for name in Topology.from_recordings(FIXTURES / case).names:
        assert name in texts
    assert "href" not in ET.tostring(root, encoding="unicode")  # self-contained


def _lines(root: ET.Element, colour: str) -> list[ET.Element]:
    """Lines of that colour in the drawing (not the legend)."""
    legend = {id(e) for g in root.iter(f"{NS}g") if g.get("class") == "legend" for e in g.iter()}
    return [e for e in root.iter(f"{NS}line") if e.get("stroke") == colour and id(e) not in legend]


def test_missing_mesh_links_are_dashed_red():
    lines = _lines(svg_of("four-macs-broken-mesh"), MISSING)
    assert len(lines) == 1 and lines[0].get("stroke-dasharray")
    assert _lines(svg_of("four-m3-ultra-mesh"), MISSING) == []


def test_many_missing_links_are_hidden_unless_asked():
    assert _lines(svg_of("eight-macs-ring"), MISSING) == []
    assert len(_lines(svg_of("eight-macs-ring", show_missing=True), MISSING)) == 20


def test_foreign_machine_is_dashed_grey():
    root = svg_of("cable-to-foreign-mac")
    assert len(_lines(root, FOREIGN)) == 1
    assert any("MacBook Pro" in (t.text or "") for t in root.iter(f"{NS}text"))


def test_cables_are_coloured_by_speed():
    root = svg_of("tb4-and-tb5-mixed")
    assert len(_lines(root, cable_colour(40))) == 2
    assert len(_lines(root, cable_colour(80))) == 1
    assert cable_colour(None) != cable_colour(80) != cable_colour(40)


def test_host_names_are_escaped():
    from mlx_jupyter.topology import MacHost

    svg = Topology([MacHost("<a&b>"), MacHost('q"uote')]).to_svg()
    ET.fromstring(svg)
    assert "&lt;a&amp;b&gt;" in svg


def test_dot_node_ids_are_unique():
    ids = [node_id(i) for i in range(800)]
    assert len(set(ids)) == len(ids) and ids[:3] == ["a", "b", "c"] and ids[26] == "aa"


def two_hosts_on_a_foreign_mac(second_uuid: str = "F-1") -> Topology:
    """a and b both on the hub of an unlisted MacBook (each sees the MacBook's port UUID F-1)."""
    from mlx_jupyter.topology import MacHost, Peer, Port

    book = Peer("F-1", "MacBook Pro", "Mac17,7")
    other = Peer(second_uuid, "MacBook Pro", "Mac17,7")
    a = MacHost("a", (Port("en2", "UA", link_gbps=80.0, peer=book), Port("en3", "UA3", link_gbps=80.0, peer=Peer("UB3"))))
    b = MacHost("b", (Port("en2", "UB", link_gbps=80.0, peer=other), Port("en3", "UB3", link_gbps=80.0, peer=Peer("UA3"))))
    return Topology([a, b])


def test_a_foreign_mac_reached_from_two_hosts_is_one_node():
    topo = two_hosts_on_a_foreign_mac()
    assert len(topo.foreign_cables) == 2
    dot = topo.to_dot()
    assert dot.count("[label=\"MacBook Pro (Mac17,7)\\nnot in host list\", style=dashed]") == 1
    assert "  a -- foreign1 [label=\"en2\", style=dashed]" in dot and "  b -- foreign1 [label=\"en2\", style=dashed]" in dot
    root = ET.fromstring(topo.to_svg())
    boxes = [r for r in root.iter(f"{NS}rect") if r.get("stroke") == FOREIGN]
    assert len(boxes) == 1 and len(_lines(root, FOREIGN)) == 2


def test_two_foreign_macs_are_two_nodes():
    topo = two_hosts_on_a_foreign_mac("F-2")
    dot = topo.to_dot()
    assert "a -- foreign1" in dot and "b -- foreign2" in dot
    root = ET.fromstring(topo.to_svg())
    assert len([r for r in root.iter(f"{NS}rect") if r.get("stroke") == FOREIGN]) == 2
