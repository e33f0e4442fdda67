"""`MlxGroup`: the Group interface on MLX's own mpi/nccl/jaccl groups (backends our core does not implement)."""

from __future__ import annotations

import itertools
import os
from typing import Any

import numpy as np

from mlx_jupyter import _core
from mlx_jupyter.collective import arrays
from mlx_jupyter.collective.activity import OpActivity
from mlx_jupyter.collective.call_tracker import CallTracker
from mlx_jupyter.collective.group_interface import Group, check_int32, check_peer, gather_shape, prepare_out, scatter_shape
from mlx_jupyter.collective.profile import OpRecord
from mlx_jupyter.vocab import backends

#: What MLX's backends lack (MLX's own table, kept in each backend's record: ``lacks``); each with what works
#: instead on that backend
LACKS = {(record.name, op): instead for record in backends.RECORDS for op, instead in record.lacks.items()}


def lacks(backend: str, op: str, exc: BaseException) -> Exception:
    """MLX's "not supported" for ``op`` on ``backend`` as one error saying what works instead."""
    instead = LACKS.get((backend, op), "our core's group (mlx_jupyter.distributed.init()) has every op")
    return NotImplementedError(f"{op}: MLX's {backend} backend has no {op} ({exc}); instead: {instead}")


def _unsupported(exc: BaseException) -> bool:
    text = str(exc)
    return "not supported" in text or "not yet implemented" in text


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
        return int(self._g.rank())

    def size(self) -> int:
        return int(self._g.size())

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
        o = None if out is None else prepare_out(out, v.shape if shape is None else shape, v.dtype, name)
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
            return self._collective("all_gather", x, out, gather_shape(arrays.view(x).shape, self.size()), stream)

    def sum_scatter(self, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        with self._op("sum_scatter", x):
            return self._sum_scatter(x, out, stream)

    def _sum_scatter(self, x: Any, out: Any, stream: Any = None) -> Any:
        shape = scatter_shape(arrays.view(x).shape, self.size())
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
        o = None if out is None else prepare_out(out, shape, v.dtype, "sum_scatter")
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
        o = None if out is None else prepare_out(out, shape, dtype, "recv")
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
