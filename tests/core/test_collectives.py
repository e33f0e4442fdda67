"""Every op x dtype x shape class against numpy, on 2, 3 and 4 local ranks."""

import pytest

from ranks import run

CHECK_ALL = r"""
import mlx.core as mx
g = dist.init(strict=True, backend="ring", timeout=30)
n = g.size()
# A small all_gather as the group's first op: it joins the board as a small all-reduce would.
assert dist.all_gather(np.array([RANK], np.int16), timeout=30).tolist() == list(range(n))
joined_by_gather = "board:shm" in g._core.link_kinds()
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64"]
SHAPES = [(), (0,), (1,), (7,), (n * 3 + 1,), (5, 3), (40000,), (300001,)]

def contribution(r, shape, dt):
    rng = np.random.default_rng(r * 1000 + len(shape) + sum(shape))
    a = rng.integers(-50, 50, size=shape)
    if dt == "bool":
        return (a > 0)
    if dt.startswith("uint"):
        a = np.abs(a)
    x = a.astype(dt)
    if dt.startswith("complex"):
        x = x + 1j * rng.integers(-5, 5, size=shape).astype(dt)
    return x

checked = 0
for dt in DTYPES:
    for shape in SHAPES:
        if len(shape) and shape[0] > 1000 and dt not in ("float32", "int32", "float16"):
            continue
        parts = [contribution(r, shape, dt) for r in range(n)]
        mine = parts[RANK]
        for name, fn in (("all_sum", np.add), ("all_max", np.maximum), ("all_min", np.minimum)):
            if dt == "complex64" and name != "all_sum":
                continue
            want = parts[0].copy()
            for p in parts[1:]:
                want = fn(want, p).astype(want.dtype) if dt != "bool" else (want | p if name != "all_min" else want & p)
            got = getattr(dist, name)(mine, timeout=30)
            assert got.dtype == want.dtype and got.shape == want.shape, (name, dt, shape, got.dtype, got.shape)
            if dt == "float16":
                assert np.allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=0.5), (name, dt, shape)
            else:
                assert np.array_equal(got, want), (name, dt, shape)
            checked += 1
        g_all = dist.all_gather(mine, timeout=30)
        assert np.array_equal(g_all, np.concatenate([np.atleast_1d(p) for p in parts])), ("all_gather", dt, shape)
        if len(shape) and shape[0] % n == 0 and dt != "bool":
            s = dist.sum_scatter(mine, timeout=30)
            total = sum(p.astype(np.complex128 if dt.startswith("complex") else np.float64) for p in parts)
            k = shape[0] // n
            assert np.allclose(s, total[RANK * k:(RANK + 1) * k].astype(dt), atol=0.5 if dt == "float16" else 0), ("sum_scatter", dt, shape)
        checked += 1

# Float results identical on every rank: gather each rank's bits and compare.
x = np.random.default_rng(RANK).standard_normal(123457).astype(np.float32)
s = dist.all_sum(x)
bits = dist.all_gather(s.view(np.uint32)[None, :])
assert all(np.array_equal(bits[0], b) for b in bits), "float results differ between ranks"
# The same for small vectors (one step through the board on one host), in place too.
for size in (1, 999, 4096):
    x = np.random.default_rng(RANK + size).standard_normal(size).astype(np.float32)
    want = sum(np.random.default_rng(r + size).standard_normal(size).astype(np.float32) for r in range(n))
    assert dist.all_sum(x, out=x) is x and np.allclose(x, want, rtol=1e-5, atol=1e-5), size
    bits = dist.all_gather(x.view(np.uint32)[None, :])
    assert all(np.array_equal(bits[0], b) for b in bits), ("small float results differ between ranks", size)

# all_gather into out=, with this rank's block of out as its input (through the board from 3 local ranks on).
for size in (3, 1000, 1 << 13):
    out = np.zeros((n, size), np.int32)
    out[RANK] = np.arange(size, dtype=np.int32) + 1000 * RANK
    assert dist.all_gather(out[RANK][None, :], out=out) is out, size
    assert all(np.array_equal(out[r], np.arange(size, dtype=np.int32) + 1000 * r) for r in range(n)), size

# The 8192 x 64 int32 column sum is exact.
m = np.arange(8192 * 64, dtype=np.int32).reshape(8192, 64) * (RANK + 1)
col = dist.all_sum(m).sum(axis=0, dtype=np.int64)
want = (np.arange(8192 * 64, dtype=np.int64).reshape(8192, 64) * sum(range(1, n + 1))).sum(axis=0)
assert np.array_equal(col, want)

# out= writes into the caller's buffer.
out = np.empty(5, np.int64)
r = dist.all_sum(np.full(5, RANK, np.int64), out=out)
assert r is out and out.tolist() == [sum(range(n))] * 5

# MLX arrays in, MLX arrays out; bfloat16 too.
y = dist.all_sum(mx.arange(6, dtype=mx.bfloat16) * (RANK + 1))
assert isinstance(y, mx.array) and y.dtype == mx.bfloat16
assert np.array_equal(np.array(y.astype(mx.float32)), np.arange(6) * sum(range(1, n + 1)))

# torch tensors in, torch tensors out (when torch is installed), bfloat16 included.
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    t = dist.all_sum(torch.arange(5, dtype=torch.float32) * (RANK + 1))
    assert isinstance(t, torch.Tensor) and t.tolist() == (np.arange(5) * sum(range(1, n + 1))).tolist()
    tb = dist.all_max(torch.full((3,), float(RANK), dtype=torch.bfloat16))
    assert tb.dtype == torch.bfloat16 and tb.float().tolist() == [n - 1.0] * 3
    tout = torch.zeros(4, dtype=torch.int64)
    assert dist.all_sum(torch.ones(4, dtype=torch.int64), out=tout) is tout and tout.tolist() == [n] * 4
    if n > 1:
        if RANK == 0:
            dist.send(torch.arange(3, dtype=torch.int32), 1)
        elif RANK == 1:
            got = dist.recv((3,), torch.int32, 0)
            assert isinstance(got, torch.Tensor) and got.tolist() == [0, 1, 2]
        g.barrier()

# Our group and MLX's own ring group, formed from the same environment, in the same process.
world = mx.distributed.init(backend="ring", strict=True)
z = mx.distributed.all_sum(mx.ones(8) * RANK, group=world)
mx.eval(z)
assert world.size() == n and np.array(z).tolist() == [float(sum(range(n)))] * 8

# send/recv between every pair, in a fixed global order.
for a in range(n):
    for b in range(n):
        if a == b:
            continue
        if RANK == a:
            dist.send(np.arange(10, dtype=np.int16) + a * 100 + b, b, timeout=30)
        elif RANK == b:
            got = dist.recv(10, "int16", a, timeout=30)
            assert got.tolist() == (np.arange(10) + a * 100 + b).tolist(), (a, b)
        dist.init().barrier(timeout=30)
like = dist.recv_like(mx.zeros((2, 2)), (RANK - 1) % n) if RANK % 2 else None
if RANK % 2 == 0 and n > 1 and (RANK + 1) % n % 2 == 1:
    dist.send(mx.ones((2, 2)) * RANK, (RANK + 1) % n)
if like is not None:
    assert isinstance(like, mx.array) and like.shape == (2, 2)

# split: evens and odds, ordered by key.
sub = g.split(RANK % 2, key=n - RANK)
members = dist.all_gather(np.array([RANK], np.int32), group=sub)
assert list(members) == sorted([r for r in range(n) if r % 2 == RANK % 2], reverse=True), members
assert sub.rank() == list(members).index(RANK)
report(checked=checked, size=n, torch=torch is not None, links=g._core.link_kinds(), joined_by_gather=joined_by_gather)
"""


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_op_dtype_and_shape(n: int, transport: str) -> None:
    results = run(n, CHECK_ALL, timeout=240, env={"MLX_JUPYTER_TRANSPORT": transport})
    assert [r["size"] for r in results] == [n] * n
    assert all(r["checked"] > 200 for r in results)
    # Ranks on one host talk through shared memory unless TCP is forced.
    want = "tcp" if transport == "tcp" else "shm"
    for r in results:
        assert all(k.endswith(":" + want) for k in r["links"]), r["links"]
        # From 3 ranks on one host, small all-reduces and all-gathers go through the board (one step).
        assert ("board:shm" in r["links"]) == (n >= 3 and transport == "auto"), r["links"]
        assert r["joined_by_gather"] == (n >= 3 and transport == "auto"), r


MIXED = """
g = dist.init(strict=True, timeout=30)
x = dist.all_sum(np.arange(100000, dtype=np.int64) * (RANK + 1))
assert np.array_equal(x, np.arange(100000, dtype=np.int64) * 10)
for peer in range(4):
    if peer != RANK:
        if RANK < peer:
            dist.send(np.array([RANK, peer]), peer)
            assert dist.recv(2, "int64", peer).tolist() == [peer, RANK]
        else:
            assert dist.recv(2, "int64", peer).tolist() == [peer, RANK]
            dist.send(np.array([RANK, peer]), peer)
report(links=g._core.link_kinds())
"""


def test_a_group_mixes_shared_memory_and_tcp() -> None:
    # Ranks 0-1 on "host A", 2-3 on "host B" (MLX_JUPYTER_HOST_ID fakes the hosts).
    hosts = {0: "A", 1: "A", 2: "B", 3: "B"}
    results = run(4, MIXED, per_rank_env={r: {"MLX_JUPYTER_HOST_ID": h} for r, h in hosts.items()})
    links = [dict(k.rsplit(":", 1) for k in r["links"]) for r in results]
    for r in range(4):
        right, left = (r + 1) % 4, (r - 1) % 4
        assert links[r]["right"] == ("shm" if hosts[right] == hosts[r] else "tcp"), links[r]
        assert links[r]["left"] == ("shm" if hosts[left] == hosts[r] else "tcp"), links[r]
    # Ranks 0 and 2 are not neighbours: a direct link, TCP across hosts.
    assert links[0]["rank 2"] == "tcp" and links[1]["rank 3"] == "tcp"


def test_singleton_without_environment() -> None:
    code = """
g = dist.init()
assert g.size() == 1 and g.rank() == 0
assert dist.all_sum(np.arange(3)).tolist() == [0, 1, 2]
assert dist.sum_scatter(np.arange(4)).tolist() == [0, 1, 2, 3]
try:
    dist.init(strict=True, backend="ring")
except dist.SetupError as exc:
    msg = str(exc)
report(msg="")
"""
    import os
    import subprocess
    import sys

    from ranks import PRELUDE

    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env["MLX_RANK"] = "0"
    p = subprocess.run([sys.executable, "-c", PRELUDE + code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


WRAPS = """
g = dist.init(strict=True, backend="ring", timeout=30)
n = g.size()
rng = np.random.default_rng(RANK)
checked = 0
# Odd-sized int8 messages leave the shared-memory rings misaligned, so that the
# larger messages after them cross the end of a ring in the middle of an element
# (the rings hold 4 MiB; the data is folded straight out of them).
for skew in (1, 3, 5, 7, 2):
    dist.all_sum(np.ones(skew, np.int8), timeout=30)
    for dt in ("float64", "complex64", "int16", "float32"):
        for _ in range(3):
            mine = rng.integers(-1000, 1000, size=(1 << 20) // np.dtype(dt).itemsize + skew).astype(dt)
            parts = dist.all_gather(mine[None, :], timeout=30)
            assert np.array_equal(dist.all_sum(mine, timeout=30), parts.sum(axis=0, dtype=dt)), (skew, dt)
            assert np.array_equal(dist.all_max(mine.real, timeout=30), parts.real.max(axis=0)), (skew, dt)
            checked += 2
report(checked=checked, links=g._core.link_kinds())
"""


@pytest.mark.parametrize("n", [2, 3])
def test_elements_split_by_the_end_of_a_ring(n: int) -> None:
    results = run(n, WRAPS, timeout=240)
    assert all(r["checked"] == 120 for r in results)
    assert all(k.endswith(":shm") for r in results for k in r["links"])


LARGE = """
g = dist.init(strict=True, backend="ring", timeout=60)
n = g.size()
count = (64 << 20) // 4  # 64 MiB of float32 / int32
# Integer-valued floats below 2**24 sum exactly in any order: every element is checked.
x = (np.arange(count, dtype=np.int64) % 4099 + RANK).astype(np.float32)
want = (np.arange(count, dtype=np.int64) % 4099 * n + sum(range(n))).astype(np.float32)
got = dist.all_sum(x, timeout=60)
assert got.dtype == np.float32 and np.array_equal(got, want)
out = np.full(count, -1, np.float32)  # the hot path: numpy in, numpy out=
assert dist.all_sum(x, out=out) is out and np.array_equal(out, want)
i = np.arange(count, dtype=np.int32) * (RANK + 1)
assert np.array_equal(dist.all_max(i, timeout=60), np.arange(count, dtype=np.int32) * n)
report(checked=3, links=g._core.link_kinds())
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_64_mib(transport: str) -> None:
    results = run(2, LARGE, timeout=200, env={"MLX_JUPYTER_TRANSPORT": transport})
    assert all(r["checked"] == 3 for r in results)
    want = "tcp" if transport == "tcp" else "shm"
    assert all(k.endswith(":" + want) for r in results for k in r["links"])
