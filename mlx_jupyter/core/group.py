"""One Group interface for the collectives: `CoreGroup` runs them on our native core,
`MlxGroup` on MLX's own mpi/nccl/jaccl groups (backends our core does not implement).

`mlx_jupyter.distributed` picks the group and calls these methods; it never asks
which kind of group it holds. MLX's collectives have no timeout and cannot be
aborted from outside: `timeout=` is not honoured on an MlxGroup.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import numpy as np

from mlx_jupyter import _core
from mlx_jupyter.core import arrays
from mlx_jupyter.launch.rank_env import RankEnv, check_seconds

#: reduction name -> the core's op code (the hot path takes codes, not strings)
OPS = {"sum": 0, "max": 1, "min": 2}


def core_options(env: RankEnv) -> _core.CoreOptions:
    """The native core's settings from the rank's environment (the core itself reads none)."""
    return _core.CoreOptions(token=env.token, verbose=env.verbose, shm=env.transport != "tcp",
                             named_shm=env.shm == "named", board=env.board,
                             dead_peer_timeout=env.dead_peer_timeout, host_id=env.host_id)


def seconds(timeout: float | None, default: float) -> float:
    """Seconds for the core (-1 = wait): `timeout`, checked, else `default` (checked when read)."""
    if timeout is None:
        return default
    return check_seconds(timeout, "timeout")


def _no_fast_path(*_: Any) -> bool:
    return False


class Group:
    """A communication group: the world from `init()`, or a part of it from `split()`."""

    #: (x, out, op code, timeout) -> True when done in place, False to take `all_reduce`
    fast_reduce: Callable[[Any, Any, int, float], bool] = staticmethod(_no_fast_path)
    #: (x, out, timeout) -> True when gathered into out, False to take `all_gather`
    fast_gather: Callable[[Any, Any, float], bool] = staticmethod(_no_fast_path)

    def __init__(self, backend: str, default_timeout: float = -1.0):
        self.backend = backend
        #: seconds an op may block when it is given no timeout= (-1: wait); RankEnv.timeout for the world
        self.default_timeout: float = check_seconds(default_timeout, "default_timeout")

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

    def all_reduce(self, op: str, x: Any, out: Any, timeout: float | None) -> Any:
        """Element-wise `op` ("sum", "max", "min") across ranks, in `x`'s type (or into `out`)."""
        raise NotImplementedError

    def all_gather(self, x: Any, out: Any, timeout: float | None) -> Any:
        raise NotImplementedError

    def sum_scatter(self, x: Any, out: Any, timeout: float | None) -> Any:
        raise NotImplementedError

    def send(self, x: Any, dst: int, timeout: float | None) -> None:
        raise NotImplementedError

    def recv(self, shape: tuple[int, ...], dtype: str, kind: str, src: int, timeout: float | None, out: Any) -> Any:
        """An array of `shape`/`dtype` from `src`, of array `kind` (numpy, mlx, torch) or into `out`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        state = ", aborted" if self.aborted else ""
        return f"<mlx_jupyter Group rank {self.rank()} of {self.size()} ({self.backend}{state})>"


def _result(v: arrays.View, kind: str, out: Any) -> Any:
    return out if out is not None else arrays.to_kind(v, kind)


def _prepare_out(out: Any, shape: tuple[int, ...], dtype: str, op: str) -> arrays.View:
    if out is None:
        return arrays.empty(shape, dtype)
    v = arrays.writable(out)
    if v.dtype != dtype or math.prod(v.shape) != math.prod(shape):
        raise ValueError(f"{op}: out= has dtype {v.dtype} and shape {v.shape}; expected {dtype} and {shape}")
    return v


class CoreGroup(Group):
    """A group of our native core (the ring backend, and the singleton)."""

    def __init__(self, core: _core.Group, backend: str = "ring", default_timeout: float = -1.0):
        super().__init__(backend, default_timeout)
        self._core = core
        # numpy in and out, contiguous, one dtype and size: checked and run in one native call
        self.fast_reduce = core.all_reduce_buffers
        self.fast_gather = core.all_gather_buffers

    def rank(self) -> int:
        return self._core.rank()

    def size(self) -> int:
        return self._core.size()

    def split(self, color: int, key: int = -1, *, timeout: float | None = None,
              options: _core.CoreOptions | None = None) -> "CoreGroup":
        """As Group.split; `options` (the same on every rank of the new group) replace this group's
        core settings for it, except the connections' token, verbosity and dead-peer timeout."""
        core = self._core.split(int(color), int(key), self.timeout(timeout), options)
        return CoreGroup(core, self.backend, self.default_timeout)

    @property
    def options(self) -> _core.CoreOptions:
        """A copy of this group's core settings (change it and pass it to split() for a variant)."""
        return self._core.options

    def barrier(self, *, timeout: float | None = None) -> None:
        self._core.barrier(self.timeout(timeout))

    def abort(self, reason: str = "aborted by the user") -> None:
        self._core.abort(reason)

    def close(self, reason: str = "closed") -> None:
        self._core.close(reason)

    @property
    def aborted(self) -> bool:
        return self._core.aborted

    def link_kinds(self) -> list[str]:
        """Per link "side:kind" (shm or tcp), and "board:shm" once the group shares a board; for tests and benchmarks."""
        return self._core.link_kinds()

    def all_reduce(self, op: str, x: Any, out: Any, timeout: float | None) -> Any:
        v = arrays.view(x)
        o = _prepare_out(out, v.shape, v.dtype, f"all_{op}")
        self._core.all_reduce(v.core, o.core, op, self.timeout(timeout))
        return _result(o, v.kind, out)

    def all_gather(self, x: Any, out: Any, timeout: float | None) -> Any:
        v = arrays.view(x)
        shape = v.shape if v.shape else (1,)
        o = _prepare_out(out, (shape[0] * self.size(),) + shape[1:], v.dtype, "all_gather")
        self._core.all_gather(v.core, o.core, self.timeout(timeout))
        return _result(o, v.kind, out)

    def sum_scatter(self, x: Any, out: Any, timeout: float | None) -> Any:
        v = arrays.view(x)
        n = self.size()
        # As MLX: axis 0 must exist (unless there is nothing to scatter) and divide evenly.
        if not v.shape and n > 1:
            raise ValueError(f"sum_scatter: a 0-d input has no axis 0 to scatter over {n} ranks: "
                             "give it at least one dimension, or use all_sum")
        if v.shape and v.shape[0] % n:
            raise ValueError(f"sum_scatter: axis 0 has length {v.shape[0]}, not divisible by the group size {n}: "
                             f"pad it to a multiple of {n}, or use all_sum")
        o = _prepare_out(out, (v.shape[0] // n,) + v.shape[1:] if v.shape else (), v.dtype, "sum_scatter")
        self._core.reduce_scatter(v.core, o.core, "sum", self.timeout(timeout))
        return _result(o, v.kind, out)

    def send(self, x: Any, dst: int, timeout: float | None) -> None:
        v = arrays.view(x)
        self._core.send(v.core, int(dst), self.timeout(timeout))

    def recv(self, shape: tuple[int, ...], dtype: str, kind: str, src: int, timeout: float | None, out: Any) -> Any:
        o = _prepare_out(out, shape, dtype, "recv")
        self._core.recv(o.core, int(src), self.timeout(timeout))
        return _result(o, kind, out)


class MlxGroup(Group):
    """An `mx.distributed.Group` with the names and array types of our API."""

    def __init__(self, mx_group: Any, backend: str, default_timeout: float = -1.0):
        super().__init__(backend, default_timeout)
        self._g = mx_group
        self._aborted = ""

    @classmethod
    def form(cls, backend: str, default_timeout: float = -1.0) -> "MlxGroup":
        import mlx.core as mx

        if backend == "jaccl-ring":
            os.environ.setdefault("MLX_JACCL_RING", "1")
            backend_mx = "jaccl"
        else:
            backend_mx = backend
        return cls(mx.distributed.init(strict=True, backend=backend_mx), backend, default_timeout)

    def rank(self) -> int:
        return self._g.rank()

    def size(self) -> int:
        return self._g.size()

    def split(self, color: int, key: int = -1, *, timeout: float | None = None) -> "MlxGroup":
        return MlxGroup(self._g.split(color, key), self.backend, self.default_timeout)

    def barrier(self, *, timeout: float | None = None) -> None:
        self._collective("all_sum", np.zeros(1, np.int32))

    def abort(self, reason: str = "aborted by the user") -> None:
        self._aborted = reason

    def close(self, reason: str = "closed") -> None:
        self.abort(reason)

    @property
    def aborted(self) -> bool:
        return bool(self._aborted)

    def _check(self) -> None:
        if self._aborted:
            raise _core.AbortedError(f"the group was aborted: {self._aborted}")

    def _collective(self, name: str, x: Any) -> Any:
        import mlx.core as mx

        self._check()
        v = arrays.view(x)
        a = x if v.kind == "mlx" else mx.array(v.core)
        r = getattr(mx.distributed, name)(a, group=self._g)
        mx.eval(r)
        return r if v.kind == "mlx" else arrays.to_kind(arrays.View(np.asarray(r), tuple(r.shape), v.dtype, "numpy"), v.kind)

    def all_reduce(self, op: str, x: Any, out: Any, timeout: float | None) -> Any:
        return self._collective(f"all_{op}", x)

    def all_gather(self, x: Any, out: Any, timeout: float | None) -> Any:
        return self._collective("all_gather", x)

    def sum_scatter(self, x: Any, out: Any, timeout: float | None) -> Any:
        return self._collective("sum_scatter", x)

    def send(self, x: Any, dst: int, timeout: float | None) -> None:
        import mlx.core as mx

        self._check()
        v = arrays.view(x)
        mx.eval(mx.distributed.send(x if v.kind == "mlx" else mx.array(v.core), dst, group=self._g))

    def recv(self, shape: tuple[int, ...], dtype: str, kind: str, src: int, timeout: float | None, out: Any) -> Any:
        import mlx.core as mx

        self._check()
        r = mx.distributed.recv(shape, getattr(mx, dtype), src, group=self._g)
        mx.eval(r)
        return r
