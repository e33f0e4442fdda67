"""Properties of the model on random cablings, and the ssh adapter's one-connection-per-host rule."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from hypothesis import given, settings, strategies as st

from mlx_jupyter.topology import MacHost, Peer, Port, Topology
from mlx_jupyter.topology.rings import find_rings


@st.composite
def cablings(draw):
    """2-6 hosts with up to 4 ports each, random cables (some one-sided), some foreign."""
    n = draw(st.integers(2, 6))
    ports = [(h, p) for h in range(n) for p in range(4)]
    free = list(ports)
    peers: dict[tuple[int, int], tuple] = {}
    for _ in range(draw(st.integers(0, 10))):
        if len(free) < 2:
            break
        a = free.pop(draw(st.integers(0, len(free) - 1)))
        if draw(st.integers(0, 5)) == 0:
            peers[a] = ("foreign", f"F{a}")
            continue
        b = free.pop(draw(st.integers(0, len(free) - 1)))
        speed = draw(st.sampled_from([40.0, 80.0]))
        peers[a] = (b, speed)
        if draw(st.booleans()):
            peers[b] = (a, speed)
    hosts = []
    for h in range(n):
        plist = []
        for p in range(4):
            peer, speed = None, None
            if (h, p) in peers:
                target, extra = peers[(h, p)]
                peer = Peer(extra) if target == "foreign" else Peer(f"U{target[0]}-{target[1]}")
                speed = None if target == "foreign" else extra
            plist.append(Port(f"en{p + 2}", f"U{h}-{p}", str(p + 1), speed, None, peer))
        hosts.append(MacHost(f"host-{h}", tuple(plist)))
    return Topology(hosts)


@settings(max_examples=150, deadline=None)
@given(cablings())
def test_model_invariants(topo):
    m = topo.connectivity()
    n = len(m)
    assert all(m[i][j] == m[j][i] for i in range(n) for j in range(n))
    assert sum(map(sum, m)) == 2 * len(topo.local_cables)
    ends = [(c.a.host, c.a.iface) for c in topo.cables] + [(c.b.host, c.b.iface) for c in topo.local_cables]
    assert len(ends) == len(set(ends))  # a port is in at most one cable
    for ring in topo.rings():
        k = len(ring.nodes)
        hops = [m[ring.nodes[i]][ring.nodes[(i + 1) % k]] for i in range(k)]
        assert min(hops) == ring.capacity > 0 and len(set(ring.nodes)) == k
    sets = [frozenset(r.nodes) for r in topo.rings()]
    assert len(sets) == len(set(sets))
    assert [len(r.nodes) for r in topo.rings()] == sorted((len(r.nodes) for r in topo.rings()), reverse=True)
    ips = [ip for pairs in topo.ip_plan().values() for _, ip in pairs]
    assert len(ips) == len(set(ips)) == 2 * len(topo.local_cables)
    dot = topo.to_dot()
    assert dot.count(" -- ") == len(topo.cables)
    assert topo.to_dot(show_foreign=False).count(" -- ") == len(topo.local_cables)
    missing = topo.missing_pairs()
    assert all(m[i][j] == 0 for i, j in missing)
    assert topo.is_full_mesh() == (not missing)


@given(st.integers(2, 7))
def test_full_mesh_has_every_subset_as_a_ring(n):
    mesh = [[0 if i == j else 1 for j in range(n)] for i in range(n)]
    rings = find_rings(mesh)
    assert len(rings) == 2 ** n - n - 1  # every subset of 2 or more hosts
    assert rings[0].nodes == tuple(range(n))


def test_ring_prefers_the_ordering_with_most_cables():
    # 0-1 x2, 1-2 x2, 2-3 x2, 3-0 x2, plus single diagonals: the square carries 2 cables per hop
    m = [[0, 2, 1, 2], [2, 0, 2, 1], [1, 2, 0, 2], [2, 1, 2, 0]]
    assert find_rings(m)[0].capacity == 2


# -- the ssh adapter -------------------------------------------------------------------------------


class FakeSSH:
    """Stands in for mlx_jupyter.net.ssh: counts connections, answers every command."""

    class SSHError(RuntimeError):
        pass

    SSHOptions = staticmethod(lambda **kw: SimpleNamespace(**kw))
    join = staticmethod(lambda argv: " ".join(argv))

    def __init__(self) -> None:
        self.connects: list[str] = []

    async def connect(self, host, opts):
        self.connects.append(host)
        await asyncio.sleep(0)
        if host == "down":
            raise self.SSHError(f"ssh to {host}: connection refused")
        return SimpleNamespace(close=lambda: None)

    async def run(self, conn, command, timeout, host, stdin=""):
        return SimpleNamespace(exit_status=0, stdout=f"{host}:{command}".encode(), stderr=b"")


def test_ssh_runner_opens_one_connection_per_host():
    from mlx_jupyter.configurator import SSHRunner

    runner = SSHRunner.__new__(SSHRunner)
    fake = FakeSSH()
    runner._ssh, runner._opts, runner._timeout = fake, None, 5.0
    runner._conns, runner._failed, runner._locks = {}, {}, {}

    async def go():
        results = await asyncio.gather(*(runner.run(h, ["echo", str(k)]) for h in ("a", "b", "down") for k in range(5)))
        await runner.close()
        return results

    results = asyncio.run(go())
    assert [fake.connects.count(h) for h in ("a", "b", "down")] == [1, 1, 1]
    assert results[0].stdout == "a:echo 0" and results[0].rc == 0
    assert all(r.rc == 255 and "connection refused" in r.stderr for r in results[10:])
