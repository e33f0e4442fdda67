"""The Python face of the collective core, named like `mlx.core.distributed`.

`init()` forms a group from MLX's environment contract (MLX_RANK, MLX_HOSTFILE),
read once per call into a RankEnv (:mod:`mlx_jupyter.vocab.rank_env` names every
variable); ops take numpy, MLX or torch arrays (or any buffer-protocol/DLPack object) and
return the input's type. Every op accepts `timeout=` (seconds; default from
MLX_JUPYTER_TIMEOUT, unset = wait) and is interrupted by Ctrl-C. A failure,
timeout or interrupt aborts the group on this rank and its peers fail at once;
call `init()` again on every rank to form a new group.

send/recv work between any two ranks: ring neighbours reuse the ring's
connections, other pairs get a direct connection on first use (the lower rank
dials the higher rank's first hostfile address).

Code written for MLX runs as is: every op takes `stream=` (MLX's meaning on MLX's groups;
checked on ours, which compute on the calling thread), and `send` sends at once and returns
`x`, so `mx.eval(dist.send(x, 1))` works as `mx.eval(mx.distributed.send(x, 1))` does.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Sequence

import numpy as np

from mlx_jupyter import _core
from mlx_jupyter.vocab.backends import ANY, NAMES as BACKENDS, find  # the one list of backends, re-exported here
from mlx_jupyter.collective import arrays
from mlx_jupyter.collective.group import OPS, CoreGroup, Group, MlxGroup, check_stream, core_options, form_ring
from mlx_jupyter.collective.side_channel import all_gather_factory, bootstrap_group, mlx_world
from mlx_jupyter.collective.recording import profile, start as start_profile, stop as stop_profile
from mlx_jupyter.collective.profile import OpRecord
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.vocab.rank_env import RankEnv, RankEnvError, RingEnv

DistributedError = _core.DistributedError
PeerError = _core.PeerError
CommTimeoutError = _core.CommTimeoutError
AbortedError = _core.AbortedError
MismatchError = _core.MismatchError
SetupError = _core.SetupError

VALID = (ANY,) + BACKENDS

__all__ = [
    "init", "is_available", "backends", "shutdown", "Group", "all_gather_factory",
    "all_sum", "all_max", "all_min", "all_gather", "sum_scatter", "send", "recv", "recv_like",
    "start_profile", "stop_profile", "profile", "OpRecord",
    "DistributedError", "PeerError", "CommTimeoutError", "AbortedError", "MismatchError", "SetupError",
]


_lock = threading.Lock()
_world: Group | None = None
#: groups of other backends asked for by name after the world formed (MLX caches one per backend too)
_others: dict[str, Group] = {}


def backends() -> list[dict[str, Any]]:
    """For each backend: name, available (machine and MLX build), machine, mlx (True/False/None), detail, fix."""
    from mlx_jupyter.collective.mlx_backends import combine

    return [combine(dict(d)) for d in _core.backends(rank_env.current().mpi_libname)]


def is_available(backend: str = "any") -> bool:
    """Whether this machine and the installed MLX build can run `backend` (not whether a group can form now)."""
    if backend == ANY:
        return True
    return any(b["name"] == backend and b["available"] for b in backends())


def _check_name(backend: str) -> None:
    if backend not in VALID:
        raise ValueError(f"unknown backend {backend!r}: valid names are {', '.join(VALID)}")


_SINGLETON = "singleton"


def _singleton(env: RankEnv) -> Group:
    return CoreGroup(_core.Group.world(0, [[]], core_options(env), -1.0), _SINGLETON, env.timeout)


_form_ring = form_ring


def init(strict: bool = False, backend: str = "any", *, timeout: float | None = None,
         all_gather_factory: Any = None) -> Group:
    """The world group, formed on the first call and cached (re-formed if it was aborted).

    `backend="any"` uses the ring when MLX_RANK/MLX_HOSTFILE are set, else MLX's
    own mpi/nccl/jaccl groups when their launch environment is present. If none
    can form: `strict=True` raises, and so does a launched rank (MLX_RANK or
    MLX_HOSTFILE set); otherwise a singleton group (rank 0 of 1). `all_gather_factory`
    (jaccl only, as MLX's): JACCL's bootstrap channel; without it and without a coordinator,
    JACCL bootstraps over our core's ring (:func:`all_gather_factory`)."""
    global _world
    _check_name(backend)
    record = find(backend)
    if all_gather_factory is not None and (record is None or not record.side_channel):
        raise ValueError(f"all_gather_factory is only supported with backend='jaccl' (as in MLX), not {backend!r}")
    with _lock:
        if _world is not None and not _world.aborted:
            if backend in (ANY, _world.backend):
                return _world
            return _another_backend(backend, strict, timeout, all_gather_factory)
        if _world is not None:
            _world.close("re-formed by init()")
            _world = None
        env = rank_env.current()
        names = _candidates(backend, env)
        # A launched ring rank's broken hostfile is an error naming the file, whatever `strict` says.
        ring = rank_env.load_ring(env) if backend == ANY and "ring" in names else None
        errors: list[str] = []
        for name in names:
            try:
                _world = _form(name, env, ring, timeout, all_gather_factory)
                return _world
            except (RankEnvError, SetupError, RuntimeError) as exc:
                if strict and backend != ANY:
                    raise
                errors.append(f"{name}: {exc}")
        # A configured ring (launched rank) that cannot form is an error: a silent
        # one-rank group would compute wrong results on every rank.
        if strict or (errors and env.launched):
            raise SetupError("Couldn't initialize any backend:\n  " + "\n  ".join(errors or [_NOTHING_CONFIGURED]))
        if errors:
            warnings.warn("mlx_jupyter: falling back to a single-rank group: " + "; ".join(errors), stacklevel=2)
        _world = _singleton(env)
        return _world


_NOTHING_CONFIGURED = ("nothing is configured: the ring needs MLX_RANK and MLX_HOSTFILE (start the ranks with "
                       "`mlx-jupyter launch` or mlx.launch), mpi a start by mpirun with 2 or more processes, nccl "
                       "and jaccl their launch environment (MLX_WORLD_SIZE/NCCL_HOST_IP, MLX_IBV_DEVICES)")


def _candidates(backend: str, env: RankEnv) -> list[str]:
    if backend != ANY:
        return [backend]
    names = ["nccl"] if "nccl" in env.launchers else []
    if env.ring_configured and not {"nccl", "jaccl"} & set(env.launchers):
        names.append("ring")
    return names + [name for name in ("mpi", "jaccl") if name in env.launchers]


def _form(name: str, env: RankEnv, ring: RingEnv | None, timeout: float | None, factory: Any = None) -> Group:
    record = find(name)
    if record is not None and record.core:   # the ring: our core's group
        return bootstrap_group() or _form_ring(env, ring, timeout)
    status = next(b for b in backends() if b["name"] == name)
    if not status["available"]:
        raise SetupError(f"the {name} backend is not available here: {status['detail']}; fix: {status['fix']}")
    return MlxGroup.wrap(mlx_world(strict=True, backend=name, factory=factory, env=env), name, env.timeout)


def _another_backend(backend: str, strict: bool, timeout: float | None, factory: Any) -> Group:
    """``init(backend=...)`` naming another backend than the world's: that backend's own group, formed and
    cached as MLX does (never the world of another backend); ``strict`` raises if it cannot form."""
    group = _others.get(backend)
    if group is not None and not group.aborted:
        return group
    env = rank_env.current()
    try:
        group = _form(backend, env, None, timeout, factory)
    except (RankEnvError, SetupError, RuntimeError) as exc:
        assert _world is not None
        if strict:
            formed = "a single-rank group" if _world.backend == _SINGLETON else f"the {_world.backend} backend's"
            raise SetupError(f"init(backend={backend!r}, strict=True): {exc} (this process's world, formed by an "
                             f"earlier init(), is {formed})") from None
        warnings.warn(f"mlx_jupyter: init(backend={backend!r}): {exc}; a single-rank group instead", stacklevel=3)
        group = _singleton(env)
    _others[backend] = group
    return group


def shutdown() -> None:
    """Aborts and forgets the world group (and any other backend's); the next `init()` on every rank forms a new one."""
    global _world
    with _lock:
        if _world is not None:
            _world.close("shut down by this rank")
        _world = None
        for group in _others.values():
            group.close("shut down by this rank")
        _others.clear()


def _group(group: Group | None) -> Group:
    """The group to use: an explicit one, else the world (never re-formed implicitly)."""
    if group is not None:
        return group
    return _world if _world is not None else init()


# all_sum/max/min and all_gather with out= first try the group's hot path (small messages
# are dominated by Python): on our core it takes numpy arrays, contiguous, of one dtype
# and the op's sizes, and checks all that itself; anything else returns False and goes the general way.
def _reduce(op: str, x: Any, group: Group | None, timeout: float | None, out: Any, stream: Any) -> Any:
    g = _world if group is None else group
    if (out is not None and timeout is None and stream is None and g is not None
            and g.fast_reduce(x, out, OPS[op], g.default_timeout)):
        return out
    return _group(group).all_reduce(op, x, out, timeout, check_stream(stream))


def all_sum(x: Any, *, group: Group | None = None, stream: Any = None, timeout: float | None = None,
            out: Any = None) -> Any:
    """Element-wise sum across ranks (integers exact, floats identical on every rank)."""
    g = _world if group is None else group
    if (out is not None and timeout is None and stream is None and g is not None
            and g.fast_reduce(x, out, 0, g.default_timeout)):
        return out
    return _group(group).all_reduce("sum", x, out, timeout, check_stream(stream))


def all_max(x: Any, *, group: Group | None = None, stream: Any = None, timeout: float | None = None,
            out: Any = None) -> Any:
    """Element-wise maximum across ranks."""
    return _reduce("max", x, group, timeout, out, stream)


def all_min(x: Any, *, group: Group | None = None, stream: Any = None, timeout: float | None = None,
            out: Any = None) -> Any:
    """Element-wise minimum across ranks."""
    return _reduce("min", x, group, timeout, out, stream)


def all_gather(x: Any, *, group: Group | None = None, stream: Any = None, timeout: float | None = None,
               out: Any = None) -> Any:
    """Concatenation of every rank's `x` along axis 0, in rank order."""
    g = _world if group is None else group
    if out is not None and timeout is None and stream is None and g is not None and g.fast_gather(x, out, g.default_timeout):
        return out
    return _group(group).all_gather(x, out, timeout, check_stream(stream))


def sum_scatter(x: Any, *, group: Group | None = None, stream: Any = None, timeout: float | None = None,
                out: Any = None) -> Any:
    """Sum across ranks, then rank r keeps the r-th slice of axis 0 (its length must divide evenly)."""
    return _group(group).sum_scatter(x, out, timeout, check_stream(stream))


def send(x: Any, dst: int, *, group: Group | None = None, stream: Any = None, timeout: float | None = None) -> Any:
    """Sends `x` to rank `dst` now and returns `x` (MLX returns a lazy array to evaluate; ours has sent when it
    returns, once the data is handed to the transport, so `mx.eval(send(...))` and a bare call both work)."""
    _group(group).send(x, dst, timeout, check_stream(stream))
    return x


def _kind_of_dtype(dtype: Any) -> str:
    mod = type(dtype).__module__ or ""
    return "mlx" if mod.startswith("mlx") else "torch" if mod.startswith("torch") else "numpy"


def recv(shape: Sequence[int] | int, dtype: Any, src: int, *, group: Group | None = None, stream: Any = None,
         timeout: float | None = None, out: Any = None) -> Any:
    """Receives an array of `shape` and `dtype` (numpy, MLX or torch dtype, or a name) from rank `src`."""
    stream = check_stream(stream)
    g = _group(group)
    shape_t = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    return g.recv(shape_t, arrays.dtype_name(dtype), _kind_of_dtype(dtype), src, timeout, out, stream)


def recv_like(x: Any, src: int, *, group: Group | None = None, stream: Any = None, timeout: float | None = None,
              out: Any = None) -> Any:
    """Receives an array shaped and typed like `x` from rank `src`, in `x`'s array type."""
    stream = check_stream(stream)
    v = arrays.view(x)
    return _group(group).recv(v.shape, v.dtype, v.kind, src, timeout, out, stream)
