"""The one Group interface every kind of group gives, and the checks of its calls that every kind shares."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from mlx_jupyter.collective import activity, arrays
from mlx_jupyter.collective.activity import OpActivity
from mlx_jupyter.collective.profile import OpRecord
from mlx_jupyter.vocab.rank_env import check_seconds

#: reduction name -> the core's op code (the hot path takes codes, not strings)
OPS = {"sum": 0, "max": 1, "min": 2}


def seconds(timeout: float | None, default: float) -> float:
    """Seconds for the core (-1 = wait): `timeout`, checked, else `default` (checked when read)."""
    if timeout is None:
        return default
    return check_seconds(timeout, "timeout")


def _no_fast_path(*_: Any) -> bool:
    return False


def check_stream(stream: Any) -> Any:
    """``stream=`` as MLX's ops take it (None, an ``mx.Stream``, an ``mx.Device`` or ``mx.cpu``/``mx.gpu``), else TypeError."""
    if stream is None:
        return None
    try:
        import mlx.core as mx
    except ImportError:
        raise TypeError("stream= names an MLX stream or device, but MLX is not installed") from None
    if not isinstance(stream, (mx.Stream, mx.Device, mx.DeviceType)):
        raise TypeError(f"stream= takes an mx.Stream or mx.Device (as MLX's ops), or None, "
                        f"not {type(stream).__name__}")
    return stream


class Group:
    """A communication group: the world from `init()`, or a part of it from `split()`."""

    #: (x, out, op code, timeout) -> True when done in place, False to take `all_reduce`
    fast_reduce: Callable[[Any, Any, int, float], bool] = staticmethod(_no_fast_path)
    #: (x, out, timeout) -> True when gathered into out, False to take `all_gather`
    fast_gather: Callable[[Any, Any, float], bool] = staticmethod(_no_fast_path)

    #: names the group in activity snapshots and profiles (the same on each of its ranks)
    group_id: str = ""

    def __init__(self, backend: str, default_timeout: float = -1.0):
        self.backend = backend
        #: seconds an op may block when it is given no timeout= (-1: wait); RankEnv.timeout for the world
        self.default_timeout: float = check_seconds(default_timeout, "default_timeout")
        activity.register(self)

    def activity(self) -> OpActivity:
        """What this group does now; safe from any thread while another is blocked in an op."""
        raise NotImplementedError

    def take_profile(self, offset: float) -> list[OpRecord]:
        """This group's records of the current profile (times + ``offset``: the epoch's), emptied."""
        raise NotImplementedError

    def timeout(self, timeout: float | None) -> float:
        """Seconds for the core (-1 = wait): the call's, else this group's default."""
        return seconds(timeout, self.default_timeout)

    def rank(self) -> int:
        raise NotImplementedError

    def size(self) -> int:
        raise NotImplementedError

    def split(self, color: int, key: int = -1, *, timeout: float | None = None) -> "Group":
        """Ranks calling with the same color form a new group, ordered by key (default: rank)."""
        raise NotImplementedError

    def barrier(self, *, timeout: float | None = None) -> None:
        raise NotImplementedError

    def abort(self, reason: str = "aborted by the user") -> None:
        """From any thread: pending and later ops fail at once here, and on the peers."""
        raise NotImplementedError

    def close(self, reason: str = "closed") -> None:
        """Aborts and frees this process's listening ports, so that `init()` can form a new group."""
        raise NotImplementedError

    @property
    def aborted(self) -> bool:
        raise NotImplementedError

    def all_reduce(self, op: str, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        """Element-wise `op` ("sum", "max", "min") across ranks, in `x`'s type (or into `out`)."""
        raise NotImplementedError

    def all_gather(self, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        raise NotImplementedError

    def sum_scatter(self, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        raise NotImplementedError

    def send(self, x: Any, dst: int, timeout: float | None, stream: Any = None) -> None:
        raise NotImplementedError

    def recv(self, shape: tuple[int, ...], dtype: str, kind: str, src: int, timeout: float | None, out: Any,
             stream: Any = None) -> Any:
        """An array of `shape`/`dtype` from `src`, of array `kind` (numpy, mlx, torch) or into `out`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        state = ", aborted" if self.aborted else ""
        return f"<mlx_jupyter Group rank {self.rank()} of {self.size()} ({self.backend}{state})>"


def gather_shape(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    """all_gather's result: axis 0 times the group size (a 0-d input counts as one element)."""
    shape = shape if shape else (1,)
    return (shape[0] * n,) + shape[1:]


def scatter_shape(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    """sum_scatter's result, as MLX: axis 0 must exist (unless there is nothing to scatter) and divide evenly."""
    if not shape and n > 1:
        raise ValueError(f"sum_scatter: a 0-d input has no axis 0 to scatter over {n} ranks: "
                         "give it at least one dimension, or use all_sum")
    if shape and shape[0] % n:
        raise ValueError(f"sum_scatter: axis 0 has length {shape[0]}, not divisible by the group size {n}: "
                         f"pad it to a multiple of {n}, or use all_sum")
    return (shape[0] // n,) + shape[1:] if shape else ()


def check_int32(value: Any, what: str) -> int:
    """A split's color or key: an int that fits in 32 bits (what the groups carry), else a clear error."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"split: {what} must be an int, not {type(value).__name__}")
    if not -2**31 <= int(value) < 2**31:
        raise ValueError(f"split: {what}={int(value)} does not fit in 32 bits (-2**31 .. 2**31-1)")
    return int(value)


def check_peer(rank: Any, size: int, what: str) -> int:
    """A peer rank for send/recv, checked before the group is touched (ValueError: the group is unaffected)."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"{what} must be a rank (an int), not {type(rank).__name__}")
    if not 0 <= int(rank) < size:
        raise ValueError(f"{what}={int(rank)} is not a rank of this group of {size} (0..{size - 1})")
    return int(rank)


def prepare_out(out: Any, shape: tuple[int, ...], dtype: str, op: str) -> arrays.View:
    if out is None:
        return arrays.empty(shape, dtype)
    v = arrays.writable(out)
    if v.dtype != dtype or math.prod(v.shape) != math.prod(shape):
        raise ValueError(f"{op}: out= has dtype {v.dtype} and shape {v.shape}; expected {dtype} and {shape}")
    return v
