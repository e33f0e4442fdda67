"""Hostfiles: several addresses per rank (parallel connections, striped payloads),
MLX_JUPYTER_HOSTFILE and MLX_JUPYTER_PORT_OFFSET."""

from __future__ import annotations

import json
import os
import sys

import pytest

from mlx_jupyter.vocab.ports import free_port_block
from ranks import Ranks

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")

BIG = r"""
g = dist.init(strict=True, backend="ring", timeout=30)
n = g.size()
rng = np.random.default_rng(RANK)
# Payloads of several 256 KiB stripes and a ragged end, so both connections carry part of each.
x = rng.integers(-2**40, 2**40, size=(3 << 20) // 8 + 12345)
parts = dist.all_gather(x[None, :], timeout=60)
assert parts.shape == (n, x.size)
assert np.array_equal(dist.all_sum(x, timeout=60), parts.sum(axis=0)), "all_sum"
assert np.array_equal(dist.all_max(x, timeout=60), parts.max(axis=0)), "all_max"
k = x.size // n
assert np.array_equal(dist.sum_scatter(x[:k * n], timeout=60), parts[:, :k * n].sum(axis=0)[RANK * k:(RANK + 1) * k])
f = rng.standard_normal(1 << 20).astype(np.float32)
s = dist.all_sum(f, timeout=60)
bits = dist.all_gather(s.view(np.uint32)[None, :], timeout=60)
assert all(np.array_equal(bits[0], b) for b in bits), "float results differ between ranks"
nxt, prv = (RANK + 1) % n, (RANK - 1) % n
if n > 1:
    got = np.empty_like(x)
    if RANK % 2 == 0:
        dist.send(x, nxt, timeout=60); dist.recv_like(x, prv, timeout=60, out=got)
    else:
        dist.recv_like(x, prv, timeout=60, out=got); dist.send(x, nxt, timeout=60)
    assert np.array_equal(got, parts[prv])
print("READY", flush=True)
sys.stdin.readline()  # connections stay up while the test looks at them
report(links=g._core.link_kinds())
"""


def _tcp(state: str) -> list[tuple[int, int]]:
    """(local port, remote port) of this network namespace's TCP sockets in `state` (01 established, 0A listen)."""
    out = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] == state:
                out.append((int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16)))
    return out


def _run_and_inspect(ranks: Ranks) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[dict]]:
    ranks.start()
    for r, p in enumerate(ranks.procs):
        line = p.stdout.readline()
        assert line.startswith("READY"), f"rank {r}: {line}{p.stderr.read() if not line else ''}"
    listening, established = _tcp("0A"), _tcp("01")
    return listening, established, ranks.results(timeout=60)


@linux_only
@pytest.mark.parametrize("n", [2, 3])
def test_two_addresses_per_rank_stripe_exactly(n: int, tmp_path) -> None:
    base = free_port_block(2 * n)
    rows = [[f"127.0.0.1:{base + 2 * r}", f"127.0.0.1:{base + 2 * r + 1}"] for r in range(n)]
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps(rows))
    env = {"MLX_HOSTFILE": str(hostfile), "MLX_JUPYTER_TRANSPORT": "tcp"}  # shared memory would bypass the stripes
    with Ranks(n, BIG, env=env) as ranks:
        listening, established, results = _run_and_inspect(ranks)
    ours = [base + 1000 + i for i in range(2 * n)]
    assert set(ours) <= {p for p, _ in listening}, (ours, listening)
    # Every rank's second address carries a ring connection from its predecessor.
    for r in range(n):
        second = base + 1000 + 2 * r + 1
        assert any(local == second for local, _ in established), (r, second, established)
    assert all(k.endswith(":tcp") for res in results for k in res["links"])


@linux_only
def test_port_offset_and_our_own_hostfile_are_honoured(tmp_path) -> None:
    n = 2
    base = free_port_block(n, offset=2345)
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{base + r}"] for r in range(n)]))
    env = {"MLX_HOSTFILE": str(hostfile), "MLX_JUPYTER_PORT_OFFSET": "2345"}
    with Ranks(n, BIG, env=env) as ranks:
        listening, _, _ = _run_and_inspect(ranks)
    ports = {p for p, _ in listening}
    assert {base + 2345, base + 2345 + 1} <= ports, (base, sorted(ports))
    assert not {base + 1000, base + 1001} & ports

    # MLX_JUPYTER_HOSTFILE: exactly its addresses, no offset applied.
    own = free_port_block(n, offset=3000)  # (only its first block is used)
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps([[f"127.0.0.1:{own + r}"] for r in range(n)]))
    env = {"MLX_HOSTFILE": str(hostfile), "MLX_JUPYTER_HOSTFILE": str(ours), "MLX_JUPYTER_PORT_OFFSET": "2345"}
    with Ranks(n, BIG, env=env) as ranks:
        listening, _, _ = _run_and_inspect(ranks)
    ports = {p for p, _ in listening}
    assert {own, own + 1} <= ports, (own, sorted(ports))
    assert not {base + 2345, base + 2346, own + 2345} & ports


def test_bad_port_offset_is_a_clear_error(tmp_path) -> None:
    from mlx_jupyter.vocab.rank_env import RankEnvError, load_ring, read

    def read_ring_env(env):
        return load_ring(read(env))

    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([["127.0.0.1:65000"], ["127.0.0.1:65001"]]))
    with pytest.raises(RankEnvError, match="MLX_JUPYTER_PORT_OFFSET='x' is not an integer"):
        read_ring_env({"MLX_RANK": "0", "MLX_HOSTFILE": str(hostfile), "MLX_JUPYTER_PORT_OFFSET": "x"})
    with pytest.raises(RankEnvError, match="outside 1..65535"):
        read_ring_env({"MLX_RANK": "0", "MLX_HOSTFILE": str(hostfile)})
    env = read_ring_env({"MLX_RANK": "0", "MLX_HOSTFILE": str(hostfile), "MLX_JUPYTER_PORT_OFFSET": "-64000"})
    assert env.addresses == [[("127.0.0.1", 1000)], [("127.0.0.1", 1001)]]
    assert os.path.basename(env.source) == "hosts.json"
