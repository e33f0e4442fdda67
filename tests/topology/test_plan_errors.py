"""Refusals of the planner that no recording reaches: partial rings, no ring and no mesh, running out of addresses."""

from __future__ import annotations

import pytest

from mlx_jupyter.topology import Cable, End, MacHost, Peer, PlanError, Port, Topology
from mlx_jupyter.topology.addressing import address_plan, subnet_address


def cabled(n: int, cables: list[tuple[int, int]]) -> Topology:
    """`n` hosts h0.. with the given cables, each seen from both ends at 80 Gb/s."""
    ports: list[list[Port]] = [[] for _ in range(n)]
    for k, (i, j) in enumerate(cables):
        a, b = f"U{i}-{k}", f"U{j}-{k}"
        ports[i].append(Port(f"en{len(ports[i]) + 2}", a, link_gbps=80.0, peer=Peer(b)))
        ports[j].append(Port(f"en{len(ports[j]) + 2}", b, link_gbps=80.0, peer=Peer(a)))
    return Topology([MacHost(f"h{i}", tuple(p)) for i, p in enumerate(ports)])


def test_ring_failure_lists_the_partial_rings():
    # a triangle h0-h1-h2 and a separate pair h3=h4 (two cables): no ring through all five
    topo = cabled(5, [(0, 1), (1, 2), (2, 0), (3, 4), (3, 4)])
    with pytest.raises(PlanError) as info:
        topo.hostfile("ring")
    msg = str(info.value)
    assert "Could not find a ring through all hosts" in msg
    assert "Rings found: h0,h1,h2;" in msg and "h3,h4" in msg and "--dot" in msg
    with pytest.raises(PlanError, match="Rings found: h0,h1,h2;"):
        topo.hostfile("jaccl-ring")


def test_ring_failure_without_any_ring():
    topo = Topology([MacHost("h0"), MacHost("h1"), MacHost("h2")])
    with pytest.raises(PlanError, match="No rings found at all. Run with --dot"):
        topo.hostfile("ring")


def test_auto_with_neither_mesh_nor_ring_names_both_problems():
    topo = cabled(4, [(0, 1), (1, 2), (2, 3)])  # a line
    with pytest.raises(PlanError) as info:
        topo.choose_backend()
    msg = str(info.value)
    assert msg.startswith("Neither a full mesh nor a ring through all hosts.")
    for pair in ("h0 is not connected to h2", "h0 is not connected to h3", "h1 is not connected to h3"):
        assert pair in msg
    assert "Could not find a ring through all hosts. Rings found: h0,h1; h1,h2; h2,h3." in msg


def test_auto_on_a_ring_without_rdma_info_is_ring_and_says_why():
    topo = cabled(4, [(0, 1), (1, 3), (3, 2), (2, 0)])  # a square, no RDMA anywhere
    chosen = topo.choose_backend()
    assert chosen.backend == "ring" and "RDMA support is unknown on h0, h1, h2, h3" in chosen.reason


def test_last_addresses_then_out_of_addresses():
    assert subnet_address(0) == ("192.168.0.1", "192.168.0.2")
    assert subnet_address(63) == ("192.168.0.253", "192.168.0.254")
    assert subnet_address(64) == ("192.168.1.1", "192.168.1.2")
    assert subnet_address(256 * 64 - 1) == ("192.168.255.253", "192.168.255.254")
    with pytest.raises(PlanError, match="ran out of 192.168.x.y addresses: 16385 cables"):
        subnet_address(256 * 64)


def test_address_plan_of_too_many_cables_is_a_plan_error():
    cable = Cable(End(0, "en2"), End(1, "en2"), 80.0)
    links = address_plan([cable] * (256 * 64))
    assert (links[-1].a_ip, links[-1].b_ip) == ("192.168.255.253", "192.168.255.254")
    foreign = Cable(End(0, "en3"), None, 80.0, foreign=Peer("F"))
    assert len(address_plan([cable] * (256 * 64) + [foreign])) == 256 * 64  # foreign cables take no addresses
    with pytest.raises(PlanError, match="ran out"):
        address_plan([cable] * (256 * 64 + 1))
