"""Buffer.to_mlx() / array_from_pointer(): real mlx.core.array objects from MLX's C++ constructor."""

from __future__ import annotations

import ctypes
import gc
import sys

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
mlx_arrays = pytest.importorskip("mlx_jupyter.collective.mlx_arrays")

import mlx_jupyter  # noqa: E402
from mlx_jupyter import Buffer  # noqa: E402

METAL = sys.platform == "darwin" and mx.metal.is_available()


def counter() -> tuple[list[int], object]:
    calls: list[int] = []
    return calls, calls.append


def test_bridge_is_built_and_returns_mlx_own_array_type() -> None:
    from mlx_jupyter import _mlx_bridge

    assert _mlx_bridge.MLX_VERSION == mx.__version__
    a = mlx_jupyter.array_from_pointer(ctypes.addressof(ctypes.c_int32(7)), (), "int32")
    assert type(a) is mx.array and a.item() == 7


def test_4096_ints_deleter_once_and_values_right() -> None:
    """MLX's own case (array from a user buffer of 4096 ints, plus one, equals ones)."""
    data = np.zeros(4096, dtype=np.int32)
    calls, free = counter()
    a = mlx_jupyter.array_from_pointer(data.ctypes.data, (4096,), "int32", free)
    if not METAL:  # Linux CPU allocator: MLX copied, and called the deleter right after the copy
        assert calls == [data.ctypes.data]
    b = a + mx.array(1)
    mx.eval(b)
    assert mx.array_equal(b, mx.ones((4096,), dtype=mx.int32)).item()
    del a, b
    gc.collect()
    assert calls == [data.ctypes.data]


def test_copy_path_owns_its_memory_after_the_deleter() -> None:
    data = np.arange(12, dtype=np.float32)
    calls, free = counter()
    a = mlx_jupyter.array_from_pointer(data.ctypes.data, [3, 4], "float32", free)
    assert a.shape == (3, 4) and a.dtype == mx.float32
    if METAL:
        pytest.skip("Metal adopts the memory: no copy (tested in test_metal_no_copy)")
    data[:] = -1  # the caller may reuse its memory once the deleter ran
    assert calls == [data.ctypes.data]
    assert np.array_equal(np.array(a), np.arange(12, dtype=np.float32).reshape(3, 4))


@pytest.mark.skipif(not METAL, reason="no-copy needs MLX's Metal allocator (macOS with a GPU); Linux copies")
def test_metal_no_copy() -> None:
    page = 16384
    raw = np.zeros(2 * page, dtype=np.uint8)
    off = (-raw.ctypes.data) % page
    view = raw[off:off + page].view(np.float32)
    calls, free = counter()
    a = mlx_jupyter.array_from_pointer(view.ctypes.data, (view.size,), "float32", free)
    assert calls == []  # adopted, not copied
    view[0] = 5.0
    assert a[0].item() == 5.0
    del a
    gc.collect()
    assert calls == [view.ctypes.data]


@pytest.mark.parametrize("shape,dtype,message", [
    ((4,), "float128", "unsupported dtype 'float128'"),
    ((4,), 7, "dtype must be a name"),
    ("four", "int32", "shape must be a sequence of ints"),
    ((-1,), "int32", "shape entries must be in 0..2**31-1"),
])
def test_bad_shape_or_dtype_raise_after_the_deleter(shape: object, dtype: object, message: str) -> None:
    data = np.zeros(4, dtype=np.int32)
    calls, free = counter()
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        mlx_jupyter.array_from_pointer(data.ctypes.data, shape, dtype, free)
    assert calls == [data.ctypes.data]


def test_bad_address_and_deleter() -> None:
    calls, free = counter()
    with pytest.raises(ValueError, match="address must be a positive int"):
        mlx_jupyter.array_from_pointer("0x10", (1,), "int32", free)
    assert calls == ["0x10"]
    with pytest.raises(TypeError, match="deleter must be callable"):
        mlx_jupyter.array_from_pointer(1, (1,), "int32", 5)


def test_buffer_to_mlx_keeps_buffer_alive_and_matches() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    calls, free = counter()
    buf = Buffer.from_pointer(data.ctypes.data, (2, 3), "float32", free)
    a = buf.to_mlx()
    assert type(a) is mx.array and a.shape == (2, 3) and a.dtype == mx.float32
    assert np.array_equal(np.array(a), data)
    del buf
    gc.collect()
    if not METAL:  # MLX copied, so it released the Buffer at once; the Buffer's deleter ran
        assert calls == [data.ctypes.data]
    del a
    gc.collect()
    assert calls == [data.ctypes.data]


def test_missing_bridge_says_why_and_how(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    real = importlib.import_module

    def no_bridge(name: str, *a: object) -> object:
        if name == "mlx_jupyter._mlx_bridge":
            raise ImportError("No module named 'mlx_jupyter._mlx_bridge'")
        return real(name, *a)

    monkeypatch.setattr(mlx_arrays.importlib, "import_module", no_bridge)
    calls, free = counter()
    with pytest.raises(ImportError, match="built without MLX's headers.*pip install 'mlx\\[cpu\\]"):
        mlx_jupyter.array_from_pointer(1234, (1,), "int32", free)
    assert calls == [1234]
