"""sum_scatter with real data for every dtype, split with the default key and ops on
sub-groups, recv dtypes, and Buffers as out= on several ranks."""

import pytest

from needs import require_module
from ranks import run

GROUPS = r"""
import mlx.core as mx
import torch
from mlx_jupyter import Buffer
g = dist.init(strict=True, backend="ring", timeout=30)
n = g.size()
assert dist.init() is g and dist.init(strict=True) is g  # the first group is cached
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64"]

def part(r, shape, dt):
    # small integers: every sum below is exact, bfloat16 and float16 included
    rng = np.random.default_rng(r * 7919 + sum(shape))
    a = rng.integers(-20, 20, size=shape)
    if dt == "bool":
        return a > 0
    if dt.startswith("uint"):
        a = np.abs(a)
    if dt == "bfloat16":
        return a.astype(np.float32)  # values; sent as bfloat16 below
    x = a.astype(dt)
    if dt == "complex64":
        x = x + 1j * rng.integers(-5, 5, size=shape).astype(dt)
    return x

def want_sum(parts, dt):
    if dt == "bool":
        return np.logical_or.reduce(parts)
    wide = np.complex128 if dt == "complex64" else np.float64 if dt in ("float16", "bfloat16", "float32", "float64") else np.int64
    return sum(p.astype(wide) for p in parts)

checked = 0
for dt in DTYPES:
    for shape in [(n * 6,), (n * 4, 3), (n * 50001,)]:
        if shape[0] > 1000 and dt not in ("float32", "int16", "bfloat16", "bool"):
            continue
        parts = [part(r, shape, dt) for r in range(n)]
        k = shape[0] // n
        want = want_sum(parts, dt)[RANK * k:(RANK + 1) * k]
        if dt == "bfloat16":
            got_mx = dist.sum_scatter(mx.array(parts[RANK]).astype(mx.bfloat16), timeout=30)
            assert isinstance(got_mx, mx.array) and got_mx.dtype == mx.bfloat16, got_mx.dtype
            got_t = dist.sum_scatter(torch.from_numpy(parts[RANK]).to(torch.bfloat16), timeout=30)
            assert isinstance(got_t, torch.Tensor) and got_t.dtype == torch.bfloat16
            assert np.array_equal(got_t.float().numpy(), want), (dt, shape)
            got = np.array(got_mx.astype(mx.float32))
        else:
            got = dist.sum_scatter(parts[RANK], timeout=30)
            assert got.dtype == np.dtype(dt), (dt, got.dtype)
        assert got.shape == (k,) + shape[1:], (dt, shape, got.shape)
        assert np.array_equal(got, want), (dt, shape)
        checked += 1

# out= for sum_scatter, a Buffer over our own array
store = np.zeros((2, 3), np.int32)
r = dist.sum_scatter(np.ones((2 * n, 3), np.int32) * (RANK + 1), out=Buffer.wrap(store), timeout=30)
assert isinstance(r, Buffer) and store.tolist() == [[n * (n + 1) // 2] * 3] * 2

# Lengths that do not divide: a clear error on every rank before any data moves (as MLX); the group lives on.
errors = []
for bad in (np.ones(n * 6 + 1, np.float32), np.ones((n + 1, 2), np.int64), np.float32(3)):
    try:
        dist.sum_scatter(bad, timeout=30)
    except ValueError as exc:
        errors.append(str(exc))
assert len(errors) == 3, errors
assert f"axis 0 has length {n * 6 + 1}, not divisible by the group size {n}" in errors[0], errors
assert f"axis 0 has length {n + 1}" in errors[1] and "0-d input" in errors[2], errors
assert not g.aborted and dist.all_sum(np.ones(2, np.int8), timeout=30).tolist() == [n, n]

# split with the default key: sub-group ranks in world-rank order
sub = g.split(RANK % 2)
members = [r for r in range(n) if r % 2 == RANK % 2]
assert sub.size() == len(members) and sub.rank() == members.index(RANK)
assert dist.all_gather(np.array([RANK], np.int32), group=sub, timeout=30).tolist() == members
x = np.arange(100003, dtype=np.int64) * (RANK + 1)
assert np.array_equal(dist.all_sum(x, group=sub, timeout=30), np.arange(100003, dtype=np.int64) * sum(m + 1 for m in members))
assert dist.all_max(np.array([RANK]), group=sub, timeout=30).tolist() == [members[-1]]
# a sub-group of all but the last rank (a ring of n-1) and a singleton
head = g.split(int(RANK == n - 1), timeout=30)
heads = list(range(n - 1)) if RANK < n - 1 else [n - 1]
assert head.size() == len(heads) and head.rank() == heads.index(RANK)
y = dist.all_sum(np.full(70001, RANK + 1, np.int32), group=head, timeout=30)
assert np.all(y == sum(m + 1 for m in heads)), y[:3]
assert dist.sum_scatter(np.ones(head.size() * 2, np.int16), group=head, timeout=30).tolist() == [head.size()] * 2
# send/recv inside the sub-groups, by sub-group rank, both ways
for s in (sub, head):
    if s.size() > 1:
        last = s.size() - 1
        if s.rank() == 0:
            dist.send(np.arange(5, dtype=np.uint8) + RANK, last, group=s, timeout=30)
            back = dist.recv(3, "float64", last, group=s, timeout=30)
            assert back.tolist() == [float(members[-1] if s is sub else heads[-1])] * 3
        elif s.rank() == last:
            first = members[0] if s is sub else heads[0]
            assert dist.recv(5, np.uint8, 0, group=s, timeout=30).tolist() == (np.arange(5) + first).tolist()
            dist.send(np.full(3, float(RANK)), 0, group=s, timeout=30)
    s.barrier(timeout=30)

# recv with numpy and MLX dtypes: the result's type follows the dtype's library
if RANK == 0:
    dist.send(np.arange(4, dtype=np.float16) / 2, 1, timeout=30)
    dist.send(np.arange(3, dtype=np.float32), 1, timeout=30)
    dist.send(np.arange(2, dtype=np.int64), 1, timeout=30)
elif RANK == 1:
    a = dist.recv((4,), np.float16, 0, timeout=30)
    assert type(a) is np.ndarray and a.dtype == np.float16 and a.tolist() == [0, 0.5, 1, 1.5], a
    b = dist.recv(3, mx.float32, 0, timeout=30)
    assert isinstance(b, mx.array) and b.dtype == mx.float32 and b.tolist() == [0, 1, 2], b
    c = dist.recv([2], np.dtype("int64"), 0, timeout=30)
    assert c.dtype == np.int64 and c.tolist() == [0, 1]
g.barrier(timeout=30)

# Buffers as out= on every rank, and viewed by torch through DLPack without a copy
raw = np.zeros(1000, np.int64)
buf = Buffer.wrap(raw)
assert dist.all_sum(np.full(1000, RANK + 1, np.int64), out=buf, timeout=30) is buf
assert np.all(raw == n * (n + 1) // 2)
t = torch.from_dlpack(buf)
assert t.data_ptr() == raw.ctypes.data and t.dtype == torch.int64 and int(t[0]) == n * (n + 1) // 2
gathered = np.zeros(3 * n, np.float32)
released = []
pb = Buffer.from_pointer(gathered.ctypes.data, [3 * n], "float32", released.append)
dist.all_gather(np.full(3, RANK, np.float32), out=pb, timeout=30)
assert gathered.tolist() == np.repeat(np.arange(n), 3).tolist()
assert torch.from_dlpack(pb).tolist() == gathered.tolist()
bits = np.zeros(4, np.uint16)
bb = Buffer.from_pointer(bits.ctypes.data, [4], "bfloat16", None)
dist.all_sum(torch.ones(4, dtype=torch.bfloat16), out=bb, timeout=30)
tb = torch.from_dlpack(bb)
assert tb.dtype == torch.bfloat16 and tb.float().tolist() == [float(n)] * 4
assert tb.data_ptr() == bits.ctypes.data
del pb
import gc; gc.collect()
assert released == [gathered.ctypes.data]
report(checked=checked, links=g._core.link_kinds())
"""


@pytest.mark.parametrize("n", [2, 3, 4])
def test_sum_scatter_split_recv_and_buffers(n: int) -> None:
    require_module("torch", "torch (the ranks check bfloat16 and DLPack through it; .ci/run installs it)")
    results = run(n, GROUPS, timeout=240)
    assert all(r["checked"] == 14 * 2 + 4 for r in results), results
