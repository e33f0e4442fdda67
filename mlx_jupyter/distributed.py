"""The Python face of the collective core, named like `mlx.core.distributed`.

`init()` forms a group from MLX's environment contract (MLX_RANK, MLX_HOSTFILE);
ops take numpy, MLX or torch arrays (or any buffer-protocol/DLPack object) and
return the input's type. Every op accepts `timeout=` (seconds; default from
MLX_JUPYTER_TIMEOUT, unset = wait) and is interrupted by Ctrl-C. A failure,
timeout or interrupt aborts the group on this rank and its peers fail at once;
call `init()` again on every rank to form a new group.

send/recv work between any two ranks: ring neighbours reuse the ring's
connections, other pairs get a direct connection on first use (the lower rank
dials the higher rank's first hostfile address).
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from typing import Any, Sequence

import numpy as np

from mlx_jupyter import _core, arrays
from mlx_jupyter.auth_warning import warn_if_unauthenticated
from mlx_jupyter.rank_env import RankEnvError, read_ring_env

DistributedError = _core.DistributedError
PeerError = _core.PeerError
CommTimeoutError = _core.CommTimeoutError
AbortedError = _core.AbortedError
MismatchError = _core.MismatchError
SetupError = _core.SetupError

BACKENDS = ("ring", "jaccl", "jaccl-ring", "nccl", "mpi")
VALID = ("any",) + BACKENDS

__all__ = [
    "init", "is_available", "backends", "shutdown", "Group",
    "all_sum", "all_max", "all_min", "all_gather", "sum_scatter", "send", "recv", "recv_like",
    "DistributedError", "PeerError", "CommTimeoutError", "AbortedError", "MismatchError", "SetupError",
]


def _seconds(value: float, what: str) -> float:
    """A timeout in seconds: -1 waits, inf (or huge) has no deadline; NaN and other negatives are errors."""
    if math.isnan(value) or (value < 0 and value != -1):
        raise ValueError(f"{what} must be >= 0 seconds (or -1 to wait), got {value}")
    return float(value)


def _env_seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds") from None
    return _seconds(value, f"{name}={text!r}")


def _env_timeout() -> float:
    """MLX_JUPYTER_TIMEOUT in seconds, or -1 (wait) when unset."""
    return _env_seconds("MLX_JUPYTER_TIMEOUT", -1.0)


def _timeout(timeout: float | None, group: "Group | None" = None) -> float:
    """Seconds for the core (-1 = wait): the call's, else the group's default."""
    if timeout is not None:
        return _seconds(timeout, "timeout")
    return group.default_timeout if group is not None else _env_timeout()


class Group:
    """A communication group: the world from `init()`, or a part of it from `split()`."""

    def __init__(self, core: Any, backend: str = "ring"):
        self._core = core
        # (x, out, op code, timeout) -> True when done, False for the general path
        self._fast_reduce = core.all_reduce_buffers if core is not None else _no_fast_reduce
        self.backend = backend
        #: seconds an op may block when it is given no timeout= (-1: wait); from MLX_JUPYTER_TIMEOUT
        self.default_timeout: float = _env_timeout()

    def rank(self) -> int:
        return self._core.rank()

    def size(self) -> int:
        return self._core.size()

    def split(self, color: int, key: int = -1, *, timeout: float | None = None) -> "Group":
        """Ranks calling with the same color form a new group, ordered by key (default: rank)."""
        return Group(self._core.split(int(color), int(key), _timeout(timeout, self)), self.backend)

    def barrier(self, *, timeout: float | None = None) -> None:
        self._core.barrier(_timeout(timeout, self))

    def abort(self, reason: str = "aborted by the user") -> None:
        """From any thread: pending and later ops fail at once here, and on the peers."""
        self._core.abort(reason)

    def close(self, reason: str = "closed") -> None:
        """Aborts and frees this process's listening ports, so that `init()` can form a new group."""
        self._core.close(reason)

    @property
    def aborted(self) -> bool:
        return self._core.aborted

    def __repr__(self) -> str:
        state = ", aborted" if self.aborted else ""
        return f"<mlx_jupyter Group rank {self.rank()} of {self.size()} ({self.backend}{state})>"


_lock = threading.Lock()
_world: Group | None = None


def backends() -> list[dict[str, Any]]:
    """For each backend: name, available (machine and MLX build), machine, mlx (True/False/None), detail, fix."""
    from mlx_jupyter.mlx_backends import combine

    return [combine(dict(d)) for d in _core.backends()]


def is_available(backend: str = "any") -> bool:
    """Whether this machine and the installed MLX build can run `backend` (not whether a group can form now)."""
    if backend == "any":
        return True
    return any(b["name"] == backend and b["available"] for b in backends())


def _check_name(backend: str) -> None:
    if backend not in VALID:
        raise ValueError(f"unknown backend {backend!r}: valid names are {', '.join(VALID)}")


def _singleton() -> Group:
    return Group(_core.Group.world(0, [[]], "", False, -1.0), "singleton")


TRANSPORTS = ("auto", "tcp")


def _form_ring(timeout: float | None) -> Group:
    transport = os.environ.get("MLX_JUPYTER_TRANSPORT", "auto") or "auto"
    if transport not in TRANSPORTS:
        raise SetupError(f"MLX_JUPYTER_TRANSPORT={transport!r} is not one of {', '.join(TRANSPORTS)}")
    env = read_ring_env()
    if env is None:
        raise SetupError("the ring backend needs MLX_RANK and MLX_HOSTFILE (set by `mlx-jupyter launch` or mlx.launch)")
    token = os.environ.get("MLX_JUPYTER_TOKEN", "")
    verbose = bool(os.environ.get("MLX_RING_VERBOSE") or os.environ.get("MLX_JUPYTER_VERBOSE"))
    t = _timeout(timeout)
    if t < 0:  # forming the ring must not wait forever for a peer that never starts
        t = _env_seconds("MLX_JUPYTER_CONNECT_TIMEOUT", 120.0)
    dead = _env_seconds("MLX_JUPYTER_DEAD_PEER_TIMEOUT", 10.0)
    if not 0 < dead <= 86400:
        raise ValueError(f"MLX_JUPYTER_DEAD_PEER_TIMEOUT={dead!r} must be a number of seconds in (0, 86400]")
    try:
        core = _core.Group.world(env.rank, env.addresses, token, verbose, t)
    except SetupError as exc:
        raise SetupError(f"{exc} [rank {env.rank}, {env.source}]") from None
    warn_if_unauthenticated(token, env.addresses)
    return Group(core, "ring")


def init(strict: bool = False, backend: str = "any", *, timeout: float | None = None) -> Group:
    """The world group, formed on the first call and cached (re-formed if it was aborted).

    `backend="any"` uses the ring when MLX_RANK/MLX_HOSTFILE are set, else MLX's
    own mpi/nccl/jaccl groups when their launch environment is present. If none
    can form: `strict=True` raises, and so does a launched rank (MLX_RANK or
    MLX_HOSTFILE set); otherwise a singleton group (rank 0 of 1)."""
    global _world
    _check_name(backend)
    with _lock:
        if _world is not None:
            if not _world.aborted:
                return _world
            _world.close("re-formed by init()")
            _world = None
        errors: list[str] = []
        for name in _candidates(backend):
            try:
                _world = _form(name, timeout)
                return _world
            except (RankEnvError, SetupError, RuntimeError) as exc:
                if strict and backend != "any":
                    raise
                errors.append(f"{name}: {exc}")
        # A configured ring (launched rank) that cannot form is an error: a silent
        # one-rank group would compute wrong results on every rank.
        launched = bool(os.environ.get("MLX_RANK") or os.environ.get("MLX_HOSTFILE"))
        if strict or (errors and launched):
            raise SetupError("Couldn't initialize any backend:\n  " + "\n  ".join(errors or [_NOTHING_CONFIGURED]))
        if errors:
            warnings.warn("mlx_jupyter: falling back to a single-rank group: " + "; ".join(errors), stacklevel=2)
        _world = _singleton()
        return _world


_NOTHING_CONFIGURED = ("nothing is configured: the ring needs MLX_RANK and MLX_HOSTFILE (start the ranks with "
                       "`mlx-jupyter launch` or mlx.launch), mpi a start by mpirun, nccl and jaccl their launch "
                       "environment (MLX_WORLD_SIZE/NCCL_HOST_IP, MLX_JACCL_COORDINATOR)")


def _candidates(backend: str) -> list[str]:
    if backend != "any":
        return [backend]
    env = os.environ
    names = []
    if env.get("MLX_WORLD_SIZE") and env.get("NCCL_HOST_IP"):
        names.append("nccl")
    if read_ring_env() is not None and not env.get("MLX_JACCL_COORDINATOR") and not env.get("NCCL_HOST_IP"):
        names.append("ring")
    if env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE"):
        names.append("mpi")
    if env.get("MLX_JACCL_COORDINATOR") or env.get("JACCL_COORDINATOR"):
        names.append("jaccl")
    return names


def _form(name: str, timeout: float | None) -> Group:
    if name == "ring":
        return _form_ring(timeout)
    status = next(b for b in backends() if b["name"] == name)
    if not status["available"]:
        raise SetupError(f"the {name} backend is not available here: {status['detail']}; fix: {status['fix']}")
    from mlx_jupyter.mlx_group import MlxGroup

    return MlxGroup.form(name)


def shutdown() -> None:
    """Aborts and forgets the world group; the next `init()` on every rank forms a new one."""
    global _world
    with _lock:
        if _world is not None:
            _world.close("shut down by this rank")
        _world = None


def _group(group: Group | None) -> Group:
    """The group to use: an explicit one, else the world (never re-formed implicitly)."""
    if group is not None:
        return group
    return _world if _world is not None else init()


def _result(v: arrays.View, kind: str, out: Any) -> Any:
    return out if out is not None else arrays.to_kind(v, kind)


def _prepare_out(out: Any, shape: tuple[int, ...], dtype: str, op: str) -> arrays.View:
    if out is None:
        return arrays.empty(shape, dtype)
    v = arrays.writable(out)
    if v.dtype != dtype or math.prod(v.shape) != math.prod(shape):
        raise ValueError(f"{op}: out= has dtype {v.dtype} and shape {v.shape}; expected {dtype} and {shape}")
    return v


def _no_fast_reduce(*_: Any) -> bool:
    return False


# all_sum/max/min with out= first try the core's hot path (small messages are
# dominated by Python): it takes numpy arrays, contiguous, of one dtype and size,
# and checks all that itself; anything else returns False and goes through _reduce.
def _reduce(op: str, name: str, x: Any, group: Group | None, timeout: float | None, out: Any) -> Any:
    g = _group(group)
    if hasattr(g, "mlx_reduce"):
        return g.mlx_reduce(name, x)
    v = arrays.view(x)
    o = _prepare_out(out, v.shape, v.dtype, name)
    g._core.all_reduce(v.core, o.core, op, _timeout(timeout, g))
    return _result(o, v.kind, out)


def all_sum(x: Any, *, group: Group | None = None, timeout: float | None = None, out: Any = None) -> Any:
    """Element-wise sum across ranks (integers exact, floats identical on every rank)."""
    g = _world if group is None else group
    if out is not None and timeout is None and g is not None and g._fast_reduce(x, out, 0, g.default_timeout):
        return out
    return _reduce("sum", "all_sum", x, group, timeout, out)


def all_max(x: Any, *, group: Group | None = None, timeout: float | None = None, out: Any = None) -> Any:
    """Element-wise maximum across ranks."""
    g = _world if group is None else group
    if out is not None and timeout is None and g is not None and g._fast_reduce(x, out, 1, g.default_timeout):
        return out
    return _reduce("max", "all_max", x, group, timeout, out)


def all_min(x: Any, *, group: Group | None = None, timeout: float | None = None, out: Any = None) -> Any:
    """Element-wise minimum across ranks."""
    g = _world if group is None else group
    if out is not None and timeout is None and g is not None and g._fast_reduce(x, out, 2, g.default_timeout):
        return out
    return _reduce("min", "all_min", x, group, timeout, out)


def _leading(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape if shape else (1,)


def all_gather(x: Any, *, group: Group | None = None, timeout: float | None = None, out: Any = None) -> Any:
    """Concatenation of every rank's `x` along axis 0, in rank order."""
    g = _group(group)
    if hasattr(g, "mlx_reduce"):
        return g.mlx_reduce("all_gather", x)
    v = arrays.view(x)
    shape = _leading(v.shape)
    o = _prepare_out(out, (shape[0] * g.size(),) + shape[1:], v.dtype, "all_gather")
    g._core.all_gather(v.core, o.core, _timeout(timeout, g))
    return _result(o, v.kind, out)


def sum_scatter(x: Any, *, group: Group | None = None, timeout: float | None = None, out: Any = None) -> Any:
    """Sum across ranks, then rank r keeps the r-th slice of axis 0 (its length must divide evenly)."""
    g = _group(group)
    if hasattr(g, "mlx_reduce"):
        return g.mlx_reduce("sum_scatter", x)
    v = arrays.view(x)
    n = g.size()
    # As MLX: axis 0 must exist (unless there is nothing to scatter) and divide evenly.
    if not v.shape and n > 1:
        raise ValueError(f"sum_scatter: a 0-d input has no axis 0 to scatter over {n} ranks: "
                         "give it at least one dimension, or use all_sum")
    if v.shape and v.shape[0] % n:
        raise ValueError(f"sum_scatter: axis 0 has length {v.shape[0]}, not divisible by the group size {n}: "
                         f"pad it to a multiple of {n}, or use all_sum")
    o = _prepare_out(out, (v.shape[0] // n,) + v.shape[1:] if v.shape else (), v.dtype, "sum_scatter")
    g._core.reduce_scatter(v.core, o.core, "sum", _timeout(timeout, g))
    return _result(o, v.kind, out)


def send(x: Any, dst: int, *, group: Group | None = None, timeout: float | None = None) -> None:
    """Sends `x` to rank `dst`; returns once the data is handed to the transport."""
    g = _group(group)
    if hasattr(g, "mlx_send"):
        return g.mlx_send(x, dst)
    v = arrays.view(x)
    g._core.send(v.core, int(dst), _timeout(timeout, g))
    return None


def _kind_of_dtype(dtype: Any) -> str:
    mod = type(dtype).__module__ or ""
    return "mlx" if mod.startswith("mlx") else "torch" if mod.startswith("torch") else "numpy"


def recv(shape: Sequence[int] | int, dtype: Any, src: int, *, group: Group | None = None,
         timeout: float | None = None, out: Any = None) -> Any:
    """Receives an array of `shape` and `dtype` (numpy, MLX or torch dtype, or a name) from rank `src`."""
    g = _group(group)
    shape_t = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    name = arrays.dtype_name(dtype)
    if hasattr(g, "mlx_recv"):
        return g.mlx_recv(shape_t, name, src)
    o = _prepare_out(out, shape_t, name, "recv")
    g._core.recv(o.core, int(src), _timeout(timeout, g))
    return _result(o, _kind_of_dtype(dtype), out)


def recv_like(x: Any, src: int, *, group: Group | None = None, timeout: float | None = None, out: Any = None) -> Any:
    """Receives an array shaped and typed like `x` from rank `src`, in `x`'s array type."""
    v = arrays.view(x)
    g = _group(group)
    if hasattr(g, "mlx_recv"):
        return g.mlx_recv(v.shape, v.dtype, src)
    o = _prepare_out(out, v.shape, v.dtype, "recv_like")
    g._core.recv(o.core, int(src), _timeout(timeout, g))
    return _result(o, v.kind, out)
