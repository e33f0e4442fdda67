"""`CoreGroup`: the Group interface on our native core (the ring backend, and the singleton)."""

from __future__ import annotations

import weakref
from typing import Any

from mlx_jupyter import _core
from mlx_jupyter.collective import arrays, recording
from mlx_jupyter.collective.activity import OpActivity
from mlx_jupyter.collective.auth_warning import warn_if_unauthenticated
from mlx_jupyter.collective.group_interface import (OPS, Group, check_int32, check_peer, gather_shape, prepare_out,
                                                    scatter_shape, seconds)
from mlx_jupyter.collective.profile import OpRecord
from mlx_jupyter.vocab.rank_env import RankEnv, RingEnv, load_ring


def core_options(env: RankEnv) -> _core.CoreOptions:
    """The native core's settings from the rank's environment (the core itself reads none)."""
    return _core.CoreOptions(token=env.token, verbose=env.verbose, shm=env.transport != "tcp",
                             named_shm=env.shm == "named", board=env.board,
                             dead_peer_timeout=env.dead_peer_timeout, host_id=env.host_id)


def _result(v: arrays.View, kind: str, out: Any) -> Any:
    return out if out is not None else arrays.to_kind(v, kind)


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
        o = prepare_out(out, v.shape, v.dtype, f"all_{op}")
        self._core.all_reduce(v.core, o.core, OPS[op], self.timeout(timeout))
        return _result(o, v.kind, out)

    def all_gather(self, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        v = arrays.view(x)
        o = prepare_out(out, gather_shape(v.shape, self.size()), v.dtype, "all_gather")
        self._core.all_gather(v.core, o.core, self.timeout(timeout))
        return _result(o, v.kind, out)

    def sum_scatter(self, x: Any, out: Any, timeout: float | None, stream: Any = None) -> Any:
        v = arrays.view(x)
        o = prepare_out(out, scatter_shape(v.shape, self.size()), v.dtype, "sum_scatter")
        self._core.reduce_scatter(v.core, o.core, OPS["sum"], self.timeout(timeout))
        return _result(o, v.kind, out)

    def send(self, x: Any, dst: int, timeout: float | None, stream: Any = None) -> None:
        dst = check_peer(dst, self.size(), "dst")
        v = arrays.view(x)
        self._core.send(v.core, dst, self.timeout(timeout))

    def recv(self, shape: tuple[int, ...], dtype: str, kind: str, src: int, timeout: float | None, out: Any,
             stream: Any = None) -> Any:
        src = check_peer(src, self.size(), "src")
        o = prepare_out(out, shape, dtype, "recv")
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


def _hand_over(core: _core.Group, group_id: str) -> None:
    if recording.recording():
        recording.keep_orphans(recording.native_records(core, group_id, 0.0))
