"""Groups of MLX's own mpi/nccl/jaccl backends behind our API, for backends our
core does not implement. MLX's collectives have no timeout and cannot be
aborted from outside: `timeout=` is not honoured on these groups."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mlx_jupyter import arrays
from mlx_jupyter.distributed import AbortedError, Group


class MlxGroup(Group):
    """An `mx.distributed.Group` with the names and array types of our API."""

    def __init__(self, mx_group: Any, backend: str):
        super().__init__(None, backend)
        self._g = mx_group
        self._aborted = ""

    @classmethod
    def form(cls, backend: str) -> "MlxGroup":
        import mlx.core as mx

        if backend == "jaccl-ring":
            os.environ.setdefault("MLX_JACCL_RING", "1")
            backend_mx = "jaccl"
        else:
            backend_mx = backend
        return cls(mx.distributed.init(strict=True, backend=backend_mx), backend)

    def rank(self) -> int:
        return self._g.rank()

    def size(self) -> int:
        return self._g.size()

    def split(self, color: int, key: int = -1, *, timeout: float | None = None) -> "MlxGroup":
        return MlxGroup(self._g.split(color, key), self.backend)

    def barrier(self, *, timeout: float | None = None) -> None:
        self.mlx_reduce("all_sum", np.zeros(1, np.int32))

    def abort(self, reason: str = "aborted by the user") -> None:
        self._aborted = reason

    def close(self, reason: str = "closed") -> None:
        self.abort(reason)

    @property
    def aborted(self) -> bool:
        return bool(self._aborted)

    def _check(self) -> None:
        if self._aborted:
            raise AbortedError(f"the group was aborted: {self._aborted}")

    def mlx_reduce(self, name: str, x: Any) -> Any:
        import mlx.core as mx

        self._check()
        v = arrays.view(x)
        a = x if v.kind == "mlx" else mx.array(v.core)
        r = getattr(mx.distributed, name)(a, group=self._g)
        mx.eval(r)
        return r if v.kind == "mlx" else arrays.to_kind(arrays.View(np.asarray(r), tuple(r.shape), v.dtype, "numpy"), v.kind)

    def mlx_send(self, x: Any, dst: int) -> None:
        import mlx.core as mx

        self._check()
        v = arrays.view(x)
        mx.eval(mx.distributed.send(x if v.kind == "mlx" else mx.array(v.core), dst, group=self._g))

    def mlx_recv(self, shape: tuple[int, ...], dtype: str, src: int) -> Any:
        import mlx.core as mx

        self._check()
        r = mx.distributed.recv(shape, getattr(mx, dtype), src, group=self._g)
        mx.eval(r)
        return r
