"""Zero-copy user buffers (memory from a pointer with a deleter) and the hostfile parser's properties."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

from needs import require_module
from mlx_jupyter import Buffer


def test_reference_wrap_4096_ints_without_copy() -> None:
    raw = (ctypes.c_int32 * 4096)()
    calls: list[int] = []
    addr = ctypes.addressof(raw)
    buf = Buffer.from_pointer(addr, [4096], "int32", calls.append)
    a = np.asarray(buf)
    assert buf.address == addr and a.ctypes.data == addr and not buf.copied
    assert np.array_equal(a + 1, np.ones(4096, np.int32))
    assert calls == []
    del a, buf
    gc.collect()
    assert calls == [addr]


def test_misaligned_memory_is_copied_and_released_at_once() -> None:
    raw = (ctypes.c_uint8 * 65)()
    calls: list[int] = []
    buf = Buffer.from_pointer(ctypes.addressof(raw) + 1, [16], "float32", calls.append)
    assert buf.copied and calls == [ctypes.addressof(raw) + 1]
    del buf
    gc.collect()
    assert len(calls) == 1


def test_wrap_keeps_owner_alive_and_shares_memory() -> None:
    arr = np.arange(10, dtype=np.float64)
    buf = Buffer.wrap(arr)
    view = np.asarray(buf)
    view[0] = 42
    assert arr[0] == 42 and buf.address == arr.ctypes.data
    del arr
    gc.collect()
    assert np.asarray(buf)[0] == 42
    assert np.from_dlpack(buf)[0] == 42


def test_mlx_views_a_buffer() -> None:
    mx = pytest.importorskip("mlx.core")
    buf = Buffer.wrap(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert mx.array(buf).tolist() == [[0, 1, 2], [3, 4, 5]]
    bf = Buffer.wrap(mx.arange(4, dtype=mx.bfloat16))
    assert bf.dtype == "bfloat16"
    with pytest.raises(BufferError, match="DLPack"):
        memoryview(bf)


def test_repr_writes_the_shape_as_a_tuple() -> None:
    assert repr(Buffer.wrap(np.zeros((2, 3), np.float32))) == "Buffer(shape=(2, 3), dtype=float32)"
    assert repr(Buffer.wrap(np.zeros(4, np.int64))) == "Buffer(shape=(4,), dtype=int64)"


def test_buffer_as_out_for_a_single_rank_group() -> None:
    from mlx_jupyter import distributed as dist

    out = Buffer.wrap(np.zeros(3, np.int64))
    assert dist.all_sum(np.arange(3), out=out) is out
    assert np.asarray(out).tolist() == [0, 1, 2]


@pytest.mark.parametrize("op", ["all_sum", "all_max", "all_min", "all_gather"])
def test_numpy_out_takes_the_hot_path_only_when_it_can(op: str) -> None:
    from mlx_jupyter import distributed as dist

    call = getattr(dist, op)  # on one rank, each of them gives x back
    x = np.arange(4, dtype=np.float32)
    out = np.zeros(4, np.float32)
    assert call(x, out=out) is out and out.tolist() == [0, 1, 2, 3]
    assert call(x.reshape(2, 2), out=out).tolist() == [0, 1, 2, 3]  # sizes must match, shapes need not
    assert call(x[::2], out=np.zeros(2, np.float32)).tolist() == [0, 2]  # strided input: copied
    with pytest.raises(ValueError, match="C-contiguous"):
        call(x, out=np.zeros(8, np.float32)[::2])
    frozen = np.zeros(4, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        call(x, out=frozen)
    with pytest.raises(ValueError, match="out= has dtype"):
        call(x, out=np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="out= has dtype"):
        call(x, out=np.zeros(4, np.int32))


@pytest.mark.parametrize("address, shape, dtype, error", [
    ("ok", [4], "float8", "unsupported dtype 'float8': supported are bool"),
    ("ok", [4], 4, "dtype must be a name"),
    (0, [4], "int32", "null pointer for a non-empty buffer"),
    ("ok", [2, -1], "int32", "negative dimension -1"),
    ("ok", "abc", "int32", "shape must be a sequence of ints"),
    ("ok", [2**40, 2**40], "int32", "overflows"),
    (-8, [4], "int32", "address must be a non-negative int"),
    (1.5, [4], "int32", "address must be a non-negative int"),
])
def test_from_pointer_runs_the_deleter_once_on_every_error(address, shape, dtype, error) -> None:
    raw = (ctypes.c_int32 * 4)()
    addr = ctypes.addressof(raw) if address == "ok" else address
    calls: list = []
    with pytest.raises(ValueError, match=error):
        Buffer.from_pointer(addr, shape, dtype, calls.append)
    gc.collect()
    assert calls == [addr]  # ownership was taken: released once, before the error


def test_from_pointer_refuses_a_deleter_it_cannot_call() -> None:
    raw = (ctypes.c_int32 * 4)()
    with pytest.raises(TypeError, match="deleter must be callable"):
        Buffer.from_pointer(ctypes.addressof(raw), [4], "int32", "free")
    empty: list[int] = []
    buf = Buffer.from_pointer(0, [0], "int32", empty.append)  # nothing to point at: fine
    del buf
    gc.collect()
    assert empty == [0]


def test_out_is_never_silently_a_copy() -> None:
    torch = require_module("torch", "torch (the interop tests; .ci/run installs it)")
    from mlx_jupyter import distributed as dist

    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="non-contiguous torch tensor .*torch.empty"):
        dist.all_sum(x, out=torch.zeros(8)[::2])
    with pytest.raises(ValueError, match="non-contiguous torch tensor"):
        dist.all_sum(np.ones((2, 2), np.float32), out=torch.zeros(2, 2).t())
    with pytest.raises(ValueError, match="torch tensor on meta.*CPU tensor"):
        dist.all_sum(x, out=torch.zeros(4, device="meta"))
    with pytest.raises(ValueError, match="C-contiguous"):
        dist.all_sum(x, out=memoryview(bytearray(32)).cast("f")[::2])
    with pytest.raises(ValueError, match="writable"):
        dist.all_sum(np.ones(4, np.uint8), out=memoryview(b"abcd"))
    with pytest.raises(TypeError, match="not list"):
        dist.all_sum(x, out=[0.0] * 4)
    # what can be written in place is: contiguous CPU tensors (bfloat16 too), numpy subclasses, writable buffers
    t = torch.zeros(4)
    assert dist.all_sum(x, out=t) is t and t.tolist() == [1.0] * 4
    tb = torch.zeros(4, dtype=torch.bfloat16)
    assert dist.all_sum(torch.ones(4, dtype=torch.bfloat16), out=tb) is tb and tb.float().tolist() == [1.0] * 4
    m = np.zeros(4, np.float32).view(np.recarray)
    assert dist.all_sum(x, out=m) is m and m.tolist() == [1.0] * 4
    raw = bytearray(16)
    dist.all_sum(x, out=memoryview(raw).cast("f"))
    assert np.frombuffer(raw, np.float32).tolist() == [1.0] * 4


def test_deleter_exceptions_are_reported_not_raised(monkeypatch) -> None:
    raw = (ctypes.c_int32 * 4)()
    seen: list[BaseException] = []
    monkeypatch.setattr("sys.unraisablehook", lambda info: seen.append(info.exc_value))

    def bad(_addr: int) -> None:
        raise RuntimeError("boom")

    buf = Buffer.from_pointer(ctypes.addressof(raw), [4], "int32", bad)
    del buf
    gc.collect()
    assert len(seen) == 1 and str(seen[0]) == "boom"


def test_any_buffer_protocol_or_dlpack_object_is_accepted() -> None:
    import array

    from mlx_jupyter import distributed as dist

    assert dist.all_sum(array.array("i", [1, 2, 3])).tolist() == [1, 2, 3]
    assert dist.all_sum(memoryview(bytearray(b"\x01\x02"))).tolist() == [1, 2]
    assert dist.all_gather(Buffer.wrap(np.arange(4, dtype=np.float64))).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert dist.all_max(np.arange(6, dtype=np.float32)[::2]).tolist() == [0.0, 2.0, 4.0]  # strided input: copied
    with pytest.raises(TypeError, match="unsupported dtype"):
        dist.all_sum(np.array(["a"]))
    with pytest.raises(ValueError, match="out= has dtype"):
        dist.all_sum(np.arange(3), out=np.zeros(3, np.float32))


def test_wrapped_bytearray_cannot_resize_under_the_buffer() -> None:
    ba = bytearray(b"\x01" * 64)
    buf = Buffer.wrap(ba)
    with pytest.raises(BufferError):
        ba.extend(b"\x02" * 100_000)  # would move the memory the Buffer points at
    assert np.asarray(buf).tobytes() == b"\x01" * 64
    del buf
    gc.collect()
    ba.extend(b"\x02" * 100_000)  # the export ends with the Buffer


def test_deleter_of_a_buffer_alive_at_exit_runs() -> None:
    import subprocess
    import sys

    code = """
import ctypes
from mlx_jupyter import Buffer
raw = (ctypes.c_float * 16)()
addr = ctypes.addressof(raw)
# a cycle through the deleter's globals: only an exit hook can free it
buf = Buffer.from_pointer(addr, [16], "float32", lambda a: print("DELETED", a == addr, flush=True))
print("ALIVE", flush=True)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["ALIVE", "DELETED", "True"], (p.stdout, p.stderr)
    assert "leaked" not in p.stderr, p.stderr
