"""Array interop for the collectives: any input becomes a contiguous view the core
can read (no copy when the input already is one), and results go back in the
input's type. bfloat16, which numpy lacks, travels as uint16 bits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mlx_jupyter import _core

#: The dtype names the core supports: its own table (native/src/dtype.cpp), not a copy.
SUPPORTED: tuple[str, ...] = tuple(_core.dtypes())


def _kind(x: Any) -> str:
    mod = type(x).__module__ or ""
    if isinstance(x, (np.ndarray, _core.Buffer)):
        return "numpy"
    if mod == "mlx" or mod.startswith("mlx."):
        return "mlx"
    if mod.startswith("torch"):
        return "torch"
    return "other"


@dataclass
class View:
    """A contiguous host view of an array: `core` goes to the native ops."""

    core: Any  # numpy array or _core.Buffer
    shape: tuple[int, ...]
    dtype: str  # one of SUPPORTED
    kind: str  # numpy | mlx | torch | other
    bits: np.ndarray | None = None  # bfloat16 only: the uint16 storage behind `core`


def _bits(u16: np.ndarray) -> _core.Buffer:
    """A bfloat16 Buffer over uint16 storage (kept alive by the deleter)."""
    return _core.Buffer.from_pointer(u16.ctypes.data, list(u16.shape), "bfloat16", lambda _a, keep=u16: None)


_NUMPY_NAMES: dict[np.dtype, str] = {}


def dtype_name(dtype: Any) -> str:
    """Normalises numpy, MLX and torch dtypes (and strings) to a SUPPORTED name."""
    if isinstance(dtype, np.dtype):
        name = _NUMPY_NAMES.get(dtype)
        if name is None:
            name = _NUMPY_NAMES[dtype] = _dtype_name(dtype)
        return name
    return _dtype_name(dtype)


def _dtype_name(dtype: Any) -> str:
    text = str(dtype)
    name = text.rsplit(".", 1)[-1]
    if name not in SUPPORTED:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name == "bool_":
        name = "bool"
    if name not in SUPPORTED:
        raise TypeError(f"unsupported dtype {text!r}: supported are {', '.join(SUPPORTED)}")
    return name


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)  # (ascontiguousarray turns 0-d into 1-d)


def view(x: Any) -> View:
    """A zero-copy view of `x` when it is contiguous host memory; a contiguous copy otherwise."""
    if type(x) is np.ndarray and x.flags.c_contiguous:  # the hot path: no further inspection
        return View(x, x.shape, dtype_name(x.dtype), "numpy")
    kind = _kind(x)
    if kind == "mlx":
        name = dtype_name(x.dtype)
        if name == "bfloat16":
            bits = _contiguous(np.asarray(x.view(_mx().uint16)))
            return View(_bits(bits), tuple(x.shape), name, kind, bits)
        return View(_contiguous(np.asarray(x)), tuple(x.shape), name, kind)
    if kind == "torch":
        t = x.detach().cpu().contiguous()
        name = dtype_name(t.dtype)
        if name == "bfloat16":
            import torch

            bits = t.view(torch.int16).numpy().view(np.uint16)
            return View(_bits(bits), tuple(t.shape), name, kind, bits)
        return View(t.numpy(), tuple(t.shape), name, kind)
    if isinstance(x, _core.Buffer):
        return View(x, tuple(x.shape), x.dtype, "numpy")
    if kind == "other" and hasattr(x, "__dlpack__") and not hasattr(x, "__array_interface__"):
        try:
            x = np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError):
            buf = _core.Buffer.wrap(x)  # e.g. bfloat16 DLPack producers
            return View(buf, tuple(buf.shape), buf.dtype, "numpy")
    arr = _contiguous(np.asarray(x))
    return View(arr, arr.shape, dtype_name(arr.dtype), "numpy")


def bfloat16_view(bits: np.ndarray) -> View:
    """A bfloat16 view over uint16 storage (numpy has no bfloat16)."""
    return View(_bits(bits), tuple(bits.shape), "bfloat16", "numpy", bits)


def empty(shape: tuple[int, ...], dtype: str) -> View:
    """Fresh host memory for a result."""
    if dtype == "bfloat16":
        bits = np.empty(shape, np.uint16)
        return View(_bits(bits), tuple(shape), dtype, "numpy", bits)
    arr = np.empty(shape, np.dtype(dtype))
    return View(arr, arr.shape, dtype, "numpy")


def writable(out: Any) -> View:
    """The caller's `out=` buffer as a view the core writes into in place (never a copy)."""
    kind = _kind(out)
    if kind == "mlx":
        raise TypeError("out= cannot be an MLX array (MLX arrays are immutable): pass a numpy array, "
                        "a torch tensor or an mlx_jupyter.Buffer")
    if isinstance(out, _core.Buffer):
        return View(out, tuple(out.shape), out.dtype, "numpy")
    if kind == "torch":
        return _torch_out(out)
    arr = out.view(np.ndarray) if isinstance(out, np.ndarray) else _host_memory(out)
    if isinstance(arr, _core.Buffer):
        return View(arr, tuple(arr.shape), arr.dtype, "numpy")
    if not arr.flags.c_contiguous:
        raise ValueError(f"out= must be a C-contiguous array (this one has strides {arr.strides}): the result would "
                         "land in a copy; pass a contiguous array (np.empty(shape, dtype)) or use the return value")
    if not arr.flags.writeable:
        raise ValueError("out= must be writable (this array is read-only): pass an array the result can go into")
    return View(arr, arr.shape, dtype_name(arr.dtype), "numpy")


def _torch_out(t: Any) -> View:
    """A CPU, contiguous torch tensor as out=: its own memory; anything else is refused."""
    if t.device.type != "cpu":
        raise ValueError(f"out= is a torch tensor on {t.device}: the result is written in place into host memory, "
                         "so pass a CPU tensor (and move the result with .to(device) afterwards)")
    if not t.is_contiguous():
        raise ValueError(f"out= is a non-contiguous torch tensor (shape {tuple(t.shape)}, strides {t.stride()}): "
                         "the result would land in a copy; pass a contiguous tensor (torch.empty(shape)) "
                         "or use the return value")
    d = t.detach()
    name = dtype_name(d.dtype)
    if name == "bfloat16":
        import torch

        bits = d.view(torch.int16).numpy().view(np.uint16)
        return View(_bits(bits), tuple(d.shape), name, "torch", bits)
    return View(d.numpy(), tuple(d.shape), name, "torch")


def _host_memory(out: Any) -> Any:
    """A view of `out`'s own memory (buffer protocol or DLPack), never a copy."""
    if hasattr(out, "__dlpack__") and not hasattr(out, "__array_interface__"):
        try:
            return np.from_dlpack(out)
        except (BufferError, TypeError, RuntimeError, ValueError) as exc:
            try:
                buf = _core.Buffer.wrap(out)  # e.g. bfloat16 DLPack producers
            except (BufferError, TypeError, RuntimeError, ValueError):
                raise ValueError(f"out= ({type(out).__name__}) cannot be written in place ({exc}): pass host memory, "
                                 "e.g. a numpy array, a CPU torch tensor or an mlx_jupyter.Buffer") from None
            if buf.copied:
                raise ValueError(f"out= ({type(out).__name__}) is misaligned for its dtype: the result would land in "
                                 "a copy; pass an aligned array") from None
            return buf
    try:
        memoryview(out)
    except TypeError:
        if not hasattr(out, "__array_interface__"):
            raise TypeError(f"out= must be memory the result can be written into (a numpy array, a torch tensor, "
                            f"an mlx_jupyter.Buffer or a buffer-protocol/DLPack object), not {type(out).__name__}") from None
    return np.asarray(out)


def to_kind(v: View, kind: str) -> Any:
    """The result in the caller's array type: numpy, MLX or torch."""
    bits = v.bits if v.dtype == "bfloat16" else None  # (a bfloat16 view always has them)
    if kind == "mlx":
        mx = _mx()
        if bits is not None:
            return mx.array(bits).view(mx.bfloat16)
        return mx.array(v.core)
    if kind == "torch":
        import torch

        if bits is not None:
            return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(np.asarray(v.core))
    if v.dtype == "bfloat16":
        return v.core  # numpy has no bfloat16: hand back the Buffer (DLPack/torch/MLX can view it)
    return v.core


def _mx() -> Any:
    import mlx.core as mx

    return mx

