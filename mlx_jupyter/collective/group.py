"""One Group interface for the collectives: `CoreGroup` runs them on our native core,
`MlxGroup` on MLX's own mpi/nccl/jaccl groups (backends our core does not implement).

`mlx_jupyter.distributed` picks the group and calls these methods; it never asks
which kind of group it holds. MLX's collectives have no timeout and cannot be
aborted from outside: `timeout=` is not honoured on an MlxGroup. `stream=` has MLX's meaning on
an MlxGroup (the stream MLX computes the result on); our core moves the bytes itself, on the
calling thread, and gives back an evaluated array, so there it is only checked.
"""

from __future__ import annotations

import itertools
import math
import os
import weakref
from typing import Any, Callable

import numpy as np

from mlx_jupyter import _core
from mlx_jupyter.launch import backends
from mlx_jupyter.collective import activity, arrays, recording
from mlx_jupyter.collective.activity import OpActivity
from mlx_jupyter.collective.call_tracker import CallTracker
from mlx_jupyter.collective.profile import OpRecord
from mlx_jupyter.collective.auth_warning import warn_if_unauthenticated
from mlx_jupyter.launch.rank_env import RankEnv, RingEnv, check_seconds, load_ring

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


#: What MLX's backends lack (MLX's own table); each with what works instead on that backend
LACKS = {
    ("jaccl", "split"): "our core's group has split: mlx_jupyter.distributed.init(backend=\"ring\") forms it over the "
                        "ring mlx-jupyter plans beside JACCL (MLX_JUPYTER_HOSTFILE)",
    ("nccl", "send"): "NCCL's backend in MLX has no point to point: all_gather and take rank src's slice, or use "
                      "our core's group (mlx_jupyter.distributed.init(backend=\"ring\") on a ring launch), which has send/recv",
    ("mpi", "sum_scatter"): "all_sum then this rank's slice of axis 0 (done for you by mlx_jupyter.distributed.sum_scatter)",
    ("ring", "split"): "our core's group (mlx_jupyter.distributed.init()) has split",
    ("ring", "sum_scatter"): "all_sum then this rank's slice of axis 0 (done for you by mlx_jupyter.distributed.sum_scatter)",
}
LACKS[("jaccl-ring", "split")] = LACKS[("jaccl", "split")]
LACKS[("nccl", "recv")] = LACKS[("nccl", "send")]


def lacks(backend: str, op: str, exc: BaseException) -> Exception:
    """MLX's "not supported" for ``op`` on ``backend`` as one error saying what works instead."""
    instead = LACKS.get((backend, op), "our core's group (mlx_jupyter.distributed.init()) has every op")
    return NotImplementedError(f"{op}: MLX's {backend} backend has no {op} ({exc}); instead: {instead}")


def _unsupported(exc: BaseException) -> bool:
    text = str(exc)
    return "not supported" in text or "not yet implemented" in text


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


def _result(v: arrays.View, kind: str, out: Any) -> Any:
    return out if out is not None else arrays.to_kind(v, kind)


def _gather_shape(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    """all_gather's result: axis 0 times the group size (a 0-d input counts as one element)."""
    shape = shape if shape else (1,)
    return (shape[0] * n,) + shape[1:]


def _scatter_shape(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
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
        self.group_id = f"core:{core.id:x}"
        # numpy in and out, contiguous, one dtype and size: checked and run in one native call
        self.fast_reduce = core.all_reduce_buffers
        self.fast_gather = core.all_gather_buffers
        # a group freed while a profile is recorded hands its records over (kept until stop())
        weakref.finalize(self, _hand_over, core, self.group_id).atexit = False

    def activity(self) -> OpActivity:
        a = self._core.activity()
        return OpActivity(self.group_id, self._core.rank(), self._core.size(), a["state"], a["op"], a["seq"],
                          a["nbytes"], a["dtype"], a["elapsed"], a["waiting_on"], a["moved"], self.backend,
                          self._core.aborted, a.get("timeout"))

    def take_profile(self, offset: float) -> list[OpRecord]:
        return recording.native_records(self._core, self.group_id, offset)

    def rank(self) -> int:
        return self._core.rank()

    def size(self) -> int:
        return self._core.size()

    def split(self, color: int, key: int = -1, *, timeout: float | None = None,
              options: _core.CoreOptions | None = None) -> "CoreGroup":
        """As Group.split; `options` (the same on every rank of the new group) replace this group's
        core settings for it, except the connections' token, verbosity and dead-peer timeout."""
        color, key = check_int32(color, "color"), check_int32(key, "key")
        core = self._core.split(color, key, self.timeout(timeout), options)
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

    def all_reduce(self, op: str, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        v = arrays.view(x)
        o = _prepare_out(out, v.shape, v.dtype, f"all_{op}")
        self._core.all_reduce(v.core, o.core, OPS[op], self.timeout(timeout))
        return _result(o, v.kind, out)

    def all_gather(self, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        v = arrays.view(x)
        o = _prepare_out(out, _gather_shape(v.shape, self.size()), v.dtype, "all_gather")
        self._core.all_gather(v.core, o.core, self.timeout(timeout))
        return _result(o, v.kind, out)

    def sum_scatter(self, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        v = arrays.view(x)
        o = _prepare_out(out, _scatter_shape(v.shape, self.size()), v.dtype, "sum_scatter")
        self._core.reduce_scatter(v.core, o.core, OPS["sum"], self.timeout(timeout))
        return _result(o, v.kind, out)

    def send(self, x: Any, dst: int, timeout: float | None, stream: Any = None) -> None:
        dst = check_peer(dst, self.size(), "dst")
        v = arrays.view(x)
        self._core.send(v.core, dst, self.timeout(timeout))

    def recv(self, shape: tuple[int, ...], dtype: str, kind: str, src: int, timeout: float | None, out: Any,
             stream: Any = None) -> Any:
        src = check_peer(src, self.size(), "src")
        o = _prepare_out(out, shape, dtype, "recv")
        self._core.recv(o.core, src, self.timeout(timeout))
        return _result(o, kind, out)


def form_ring(env: RankEnv, ring: RingEnv | None = None, timeout: float | None = None) -> CoreGroup:
    """Our core's ring group from the rank's environment (``ring``: its hostfile, already read)."""
    ring = ring or load_ring(env)
    if ring is None:
        raise _core.SetupError("the ring backend needs MLX_RANK and MLX_HOSTFILE (set by `mlx-jupyter launch` or "
                               "mlx.launch)")
    t = seconds(timeout, env.timeout)
    if t < 0:  # forming the ring must not wait forever for a peer that never starts
        t = env.connect_timeout
    try:
        core = _core.Group.world(ring.rank, ring.addresses, core_options(env), t)
    except _core.SetupError as exc:
        raise _core.SetupError(f"{exc} [rank {ring.rank}, {ring.source}]") from None
    warn_if_unauthenticated(env, ring.addresses)
    return CoreGroup(core, "ring", env.timeout)


_NO_FACTORY = ("this MLX has no init(all_gather_factory=...) (MLX 0.32.4 has): pip install -U mlx, or set "
               "MLX_JACCL_COORDINATOR to rank 0's ip:port (mlx-jupyter launch sets it)")


def mlx_init(strict: bool, backend: str, factory: Any = None) -> Any:
    """``mx.distributed.init`` for our backend names (``jaccl-ring``: MLX's jaccl with ``MLX_JACCL_RING``);
    ``factory``: JACCL's side channel (``all_gather_factory``), jaccl only, as in MLX."""
    import mlx.core as mx

    record = backends.find(backend)
    for key, value in (record.mlx_env if record is not None else {}).items():
        os.environ.setdefault(key, value)
    name = backends.mlx_name(backend)
    if factory is None:
        return mx.distributed.init(strict=strict, backend=name)
    if record is None or not record.side_channel:
        raise ValueError(f"all_gather_factory works with the jaccl backend only (as in MLX), not {backend!r}")
    try:
        return mx.distributed.init(strict=strict, backend=name, all_gather_factory=factory)
    except TypeError as exc:
        if "all_gather_factory" not in str(exc) and "incompatible function arguments" not in str(exc):
            raise
        raise RuntimeError(_NO_FACTORY) from None


def _hand_over(core: _core.Group, group_id: str) -> None:
    if recording.recording():
        recording.keep_orphans(recording.native_records(core, group_id, 0.0))


_mlx_groups = itertools.count(1)


class MlxGroup(Group):
    """An `mx.distributed.Group` with the names, array types and `out=` of our API.

    MLX's ops return new arrays: a result asked for with `out=` is copied into it (checked
    before the op, like ours), and `recv` gives the requested array kind.
    """

    def __init__(self, mx_group: Any, backend: str, default_timeout: float = -1.0):
        super().__init__(backend, default_timeout)
        self._g = mx_group
        self._aborted = ""
        self._no_sum_scatter = False   # MLX's backend lacks it (its ring): all_sum and a slice instead
        self.group_id = f"mlx-{backend}:{next(_mlx_groups)}"
        #: MLX's calls, as activity snapshots and profiles see them (MLX tells us nothing itself)
        self.calls = CallTracker(self)
        self._op = self.calls.op

    def activity(self) -> OpActivity:
        return self.calls.activity()

    def take_profile(self, offset: float) -> list[OpRecord]:
        return self.calls.take(offset)

    @classmethod
    def form(cls, backend: str, default_timeout: float = -1.0, factory: Any = None) -> "MlxGroup":
        """MLX's group of ``backend`` (strict), JACCL's over ``factory``'s channel when one is given."""
        return cls.wrap(mlx_init(True, backend, factory), backend, default_timeout)

    @classmethod
    def wrap(cls, g: Any, backend: str, default_timeout: float = -1.0) -> "MlxGroup":
        """MLX's world group ``g`` of ``backend`` (from ``init(strict=True)``); an MPI world of one process is
        refused, as MLX does since 0.31 (an older MLX gives one)."""
        record = backends.find(backend)
        if record is not None and g.size() < record.min_world:   # mpi
            raise RuntimeError("[mpi] The world has a single process: launch with mpirun -n 2 or more "
                               "(mlx-jupyter launch --backend mpi) to form an mpi group")
        return cls(g, backend, default_timeout)

    def rank(self) -> int:
        return self._g.rank()

    def size(self) -> int:
        return self._g.size()

    def split(self, color: int, key: int = -1, *, timeout: float | None = None) -> "MlxGroup":
        color, key = check_int32(color, "color"), check_int32(key, "key")
        try:
            g = self._g.split(color, key)
        except RuntimeError as exc:
            if not _unsupported(exc):
                raise
            raise lacks(self.backend, "split", exc) from None
        return MlxGroup(g, self.backend, self.default_timeout)

    def barrier(self, *, timeout: float | None = None) -> None:
        with self._op("barrier"):
            self._collective("all_sum", np.zeros(1, np.int32), None, (1,))

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

    def _collective(self, name: str, x: Any, out: Any, shape: tuple[int, ...] | None = None,
                    stream: Any = None) -> Any:
        """MLX's ``name`` on ``x`` (on ``stream``); the result (of ``shape``) into ``out`` or in ``x``'s array type."""
        import mlx.core as mx

        self._check()
        v = arrays.view(x)
        o = None if out is None else _prepare_out(out, v.shape if shape is None else shape, v.dtype, name)
        r = getattr(mx.distributed, name)(x if v.kind == "mlx" else arrays.to_kind(v, "mlx"), group=self._g,
                                          stream=stream)
        mx.eval(r)
        if o is not None:
            _fill(o, r)
            return out
        return r if v.kind == "mlx" else arrays.to_kind(_host_view(r, v.dtype), v.kind)

    def all_reduce(self, op: str, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        with self._op(f"all_{op}", x):
            return self._collective(f"all_{op}", x, out, stream=stream)

    def all_gather(self, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        with self._op("all_gather", x):
            return self._collective("all_gather", x, out, _gather_shape(arrays.view(x).shape, self.size()), stream)

    def sum_scatter(self, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        with self._op("sum_scatter", x):
            return self._sum_scatter(x, out, stream)

    def _sum_scatter(self, x: Any, out: Any, stream: Any = None) -> Any:
        shape = _scatter_shape(arrays.view(x).shape, self.size())
        if not self._no_sum_scatter:
            try:
                return self._collective("sum_scatter", x, out, shape, stream)
            except RuntimeError as exc:   # "[ring] ... not supported.", "[mpi] ... not yet implemented.": before any transfer
                if not _unsupported(exc):
                    raise
                self._no_sum_scatter = True
        return self._slice_of_sum(x, out, shape, stream)

    def _slice_of_sum(self, x: Any, out: Any, shape: tuple[int, ...], stream: Any = None) -> Any:
        """sum_scatter where MLX's backend has none: the whole sum, then this rank's slice of axis 0."""
        import mlx.core as mx

        v = arrays.view(x)
        o = None if out is None else _prepare_out(out, shape, v.dtype, "sum_scatter")
        total = self._collective("all_sum", x if v.kind == "mlx" else arrays.to_kind(v, "mlx"), None, stream=stream)
        k = shape[0] if shape else 0
        part = total[self.rank() * k:(self.rank() + 1) * k] if shape else total
        mx.eval(part)
        if o is not None:
            _fill(o, part)
            return out
        return part if v.kind == "mlx" else arrays.to_kind(_host_view(part, v.dtype), v.kind)

    def send(self, x: Any, dst: int, timeout: float | None, stream: Any = None) -> None:
        import mlx.core as mx

        dst = check_peer(dst, self.size(), "dst")
        self._check()
        v = arrays.view(x)
        with self._op("send", x):
            try:
                mx.eval(mx.distributed.send(x if v.kind == "mlx" else arrays.to_kind(v, "mlx"), dst, group=self._g,
                                            stream=stream))
            except RuntimeError as exc:
                if not _unsupported(exc):
                    raise
                raise lacks(self.backend, "send", exc) from None

    def recv(self, shape: tuple[int, ...], dtype: str, kind: str, src: int, timeout: float | None, out: Any,
             stream: Any = None) -> Any:
        import mlx.core as mx

        src = check_peer(src, self.size(), "src")
        self._check()
        o = None if out is None else _prepare_out(out, shape, dtype, "recv")
        with self._op("recv"):
            try:
                r = mx.distributed.recv(shape, getattr(mx, "bool_" if dtype == "bool" else dtype), src,
                                        group=self._g, stream=stream)
                mx.eval(r)
            except RuntimeError as exc:
                if not _unsupported(exc):
                    raise
                raise lacks(self.backend, "recv", exc) from None
        if o is not None:
            _fill(o, r)
            return out
        return r if kind == "mlx" else arrays.to_kind(_host_view(r, dtype), kind)


def _host_view(r: Any, dtype: str) -> arrays.View:
    """An evaluated MLX array as a host view (bfloat16 as its uint16 bits, which numpy can hold)."""
    import mlx.core as mx

    if dtype == "bfloat16":
        return arrays.bfloat16_view(np.ascontiguousarray(np.asarray(r.view(mx.uint16))))
    return arrays.View(np.asarray(r), tuple(r.shape), dtype, "numpy")


def _fill(o: arrays.View, r: Any) -> None:
    """Copy MLX's result ``r`` into the caller's ``out=`` (already checked for dtype and size)."""
    src = _host_view(r, o.dtype)
    data = src.bits if src.bits is not None else src.core
    dst = o.bits if o.bits is not None else o.core
    if isinstance(dst, np.ndarray):
        np.copyto(dst.reshape(-1), data.reshape(-1))
    else:   # an mlx_jupyter.Buffer (or a DLPack producer's memory behind one)
        import ctypes

        assert dst.nbytes == data.nbytes
        ctypes.memmove(dst.address, np.ascontiguousarray(data).ctypes.data, data.nbytes)
