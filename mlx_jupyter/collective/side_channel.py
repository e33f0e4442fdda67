"""JACCL's bootstrap over our core's signed ring instead of a coordinator port.

MLX's ``mx.distributed.init(backend="jaccl", all_gather_factory=factory)`` calls
``factory(rank, size)`` once and then ``gather(src, n_bytes)`` a few times while it forms the
group: each call must return every rank's ``n_bytes`` in rank order (``size * n_bytes`` bytes).
:func:`all_gather_factory` gives such a factory over our core's ring (HMAC-authenticated), and
:func:`mlx_world` is ``mx.distributed.init`` with it supplied when no coordinator is set.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from mlx_jupyter.vocab import backends
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.vocab.rank_env import RankEnv

Gather = Callable[[bytes, int], bytes]
Factory = Callable[[int, int], Gather]


def all_gather_factory(group: Any = None, *, timeout: Optional[float] = None) -> Factory:
    """A factory for ``init(backend="jaccl", all_gather_factory=...)`` whose gathers run on ``group``
    (one of our groups, of the same ranks as JACCL's), or on our core's ring, formed from this rank's
    environment when JACCL first asks (``MLX_JUPYTER_HOSTFILE`` or ``MLX_HOSTFILE``). A gather waits at most
    ``timeout`` s (default: ``MLX_JUPYTER_CONNECT_TIMEOUT``, as forming a group does)."""

    def factory(rank: int, size: int) -> Gather:
        wait = timeout if timeout is not None else rank_env.current().connect_timeout
        g = group if group is not None else _core_ring(wait)
        if (rank, size) != (g.rank(), g.size()):
            raise RuntimeError(f"JACCL is rank {rank} of {size} but our core's group is rank {g.rank()} of "
                               f"{g.size()}: the launch gave JACCL (JACCL_RANK/MLX_RANK, its device file) and our "
                               "core (its ring hostfile) different ranks; start the ranks with mlx-jupyter launch")

        def gather(src: bytes, n_bytes: int) -> bytes:
            if len(src) != n_bytes:
                raise ValueError(f"all-gather: got {len(src)} bytes but n_bytes={n_bytes}")
            out = g.all_gather(np.frombuffer(src, dtype=np.uint8), None, wait)
            return np.ascontiguousarray(out).tobytes()

        return gather

    return factory


#: our core's ring formed for a bootstrap: JACCL keeps it, and distributed.init(backend="ring") takes it
#: as its world (a second ring on the same ports could not listen)
_BOOT: Any = None


def bootstrap_group() -> Any:
    """The live core group a JACCL bootstrap formed, or None."""
    return _BOOT if _BOOT is not None and not _BOOT.aborted else None


def _core_ring(timeout: Optional[float]) -> Any:
    """Our core's ring for the bootstrap, formed once per process (see :func:`bootstrap_group`)."""
    global _BOOT
    from mlx_jupyter import _core
    from mlx_jupyter.collective.group import form_ring

    if bootstrap_group() is not None:
        return _BOOT
    env = rank_env.current()
    if not env.hostfile:
        raise _core.SetupError(
            "JACCL without a coordinator bootstraps over our core's ring, but this rank has none: start it with "
            "`mlx-jupyter launch` or a cluster (they plan MLX_JUPYTER_HOSTFILE), or set MLX_JACCL_COORDINATOR")
    _BOOT = form_ring(env, None, timeout)
    return _BOOT


def wants_side_channel(backend: str, env: RankEnv) -> bool:
    """Whether JACCL should bootstrap over our core: asked for (or the only launch found), no coordinator set,
    and our core's ring configured."""
    record = backends.find(backend)
    jaccl = (record is not None and record.side_channel) or (backend == backends.ANY and env.launchers == ("jaccl",))
    return jaccl and not env.jaccl.coordinator and bool(env.hostfile)


def mlx_world(strict: bool = False, backend: str = "any", factory: Optional[Factory] = None,
              env: Optional[RankEnv] = None) -> Any:
    """``mx.distributed.init(strict, backend)``; JACCL bootstraps over our core's ring when no coordinator is set
    (or over ``factory``'s channel), and ``jaccl-ring`` is MLX's jaccl with ``MLX_JACCL_RING``."""
    from mlx_jupyter.collective.group import mlx_init

    env = env or rank_env.current()
    if factory is None and wants_side_channel(backend, env):
        factory = all_gather_factory()
    return mlx_init(strict, "jaccl" if factory is not None and backend == backends.ANY else backend, factory)
