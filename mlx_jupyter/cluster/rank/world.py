"""MLX's world group on a rank: formed early in the background, or by the first cell's setup;
and our core's group beside it. ``setup``, ``reform`` and ``mark_world_dead`` are applied from the
notebook; which user names they bind is :mod:`mlx_jupyter.cluster.rank.names`'s rule.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from mlx_jupyter.vocab import backends
from mlx_jupyter.cluster.rank import agent as _agent
from mlx_jupyter.cluster.rank.names import NAMES
from mlx_jupyter.cluster.rank.sockets import ring_ports_to_await, socket_fds, wait_listening, world_socket_fds
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.vocab.rank_env import RankEnv
from mlx_jupyter.where import mlx_calls


def this_rank_env() -> RankEnv:
    """This rank's environment: the agent's (read once when the engine started), else read now."""
    agent = _agent.AGENT
    return agent.env if agent is not None else rank_env.current()


class EarlyWorld:
    """MLX's world group, formed in a background thread before the first cell needs it.

    MLX's ring retries a refused connection only after a pause of about a second,
    and its init holds the GIL: the whole engine stands still meanwhile. So it is
    begun once the rank is up (:func:`start_world_early`, asked by the cluster
    after every rank answered its start-up probe), off the cluster's ready time,
    and the last rank first waits, without the GIL, for the others to listen
    (:func:`ring_ports_to_await`): with local ranks usually no pause at all.
    """

    def __init__(self, backend: str, strict: bool, hostfile: str, await_ports: Optional[set[int]] = None,
                 await_timeout: float = 30.0):
        self.backend = backend
        self.strict = strict
        self.hostfile = hostfile  # MLX's: its ports tell MLX's sockets from the engine's
        self.await_ports = set(await_ports or ())
        self.await_timeout = await_timeout
        self.done = threading.Event()
        self.group: Any = None
        self.error: Optional[BaseException] = None
        self.sockets: dict[int, int] = {}
        threading.Thread(target=self._form, name="mlx-world-init", daemon=True).start()

    def _form(self) -> None:
        before = socket_fds()
        try:
            import mlx.core as mx

            if self.await_ports:  # a peer that never listens (it died) is the cluster's to report
                wait_listening(self.await_ports, self.await_timeout)
            self.group = mx.distributed.init(strict=self.strict, backend=backends.mlx_name(self.backend))
        except BaseException as exc:  # reported by setup(), in the cell that needs it
            self.error = exc
        finally:
            self.sockets = world_socket_fds(before, self.hostfile)
            self.done.set()


#: MLX's world group being formed since the engine started (see :func:`start_world_early`)
EARLY_WORLD: Optional[EarlyWorld] = None


def start_world_early(wait: float = 30.0) -> bool:
    """Begin forming MLX's world in the background, if this engine is one of several ranks of a
    backend whose record says so (``early_world``: the ring), and wait up to ``wait`` s for it;
    whether it is being (or was) formed.

    Called once per rank by the cluster right after start: its answer says the world
    has formed (meanwhile MLX's init holds the GIL and the rank answers nothing).
    ``MLX_JUPYTER_EARLY_WORLD=0`` turns it off (the first cell then forms it).
    """
    global EARLY_WORLD
    if EARLY_WORLD is None:
        env = this_rank_env()
        record = backends.find(env.backend)
        if not (record is not None and record.early_world and env.size > 1 and env.early_world and env.mlx_hostfile):
            return False
        EARLY_WORLD = EarlyWorld(record.name, strict=True, hostfile=env.mlx_hostfile,
                                 await_ports=ring_ports_to_await(env.process_rank, env.mlx_hostfile))
    EARLY_WORLD.done.wait(wait)
    return True


def setup(backend: str, world: bool = True, group: bool = True, timeout: float = 30.0) -> dict[str, Any]:
    """Define ``mx``, ``world`` (MLX's group) and ``group`` (ours) in this rank's namespace, each only
    where the name is free or still the product's (:mod:`~mlx_jupyter.cluster.rank.names`).

    Runs on every rank at once (MLX's ring init waits for its neighbours).
    """
    agent = _agent.AGENT
    ns = agent.shell.user_ns if agent else {}
    import mlx.core as mx

    NAMES.bind(ns, "mx", mx)
    info: dict[str, Any] = {"rank": this_rank_env().process_rank, "world": None, "group": None, "group_error": ""}
    if world and NAMES.world is None:
        NAMES.world, sockets = _form_world(backend, timeout)
        if agent:
            agent.world_sockets = sockets
    if world and NAMES.world is not None:
        mlx_calls.install(NAMES.world)  # the where table's record of MLX's collectives
        NAMES.bind(ns, "world", NAMES.world)
        info["world"] = [NAMES.world.rank(), NAMES.world.size()]
    if group:
        info.update(reform(timeout=timeout, only_if_needed=True))
    return info


def _form_world(backend: str, timeout: float) -> tuple[Any, dict[int, int]]:
    """MLX's world group and its sockets: the early one if it was started, else formed now."""
    global EARLY_WORLD
    early = EARLY_WORLD
    if early is not None and early.backend == (backend or "any"):
        if not early.done.wait(timeout):
            raise TimeoutError(
                f"MLX's world group did not form within {timeout:g} s: is every rank up? "
                "(the cluster's status lists them)"
            )
        if early.error is not None:
            EARLY_WORLD = None  # the next cell tries again, in the foreground
            raise early.error
        return early.group, early.sockets
    from mlx_jupyter.collective.side_channel import mlx_world  # JACCL without a coordinator: over our core's ring

    env = this_rank_env()
    before = socket_fds()
    w = mlx_world(strict=env.size > 1, backend=backend or "any", env=env)
    return w, world_socket_fds(before, env.mlx_hostfile)


def reform(timeout: float = 30.0, only_if_needed: bool = False) -> dict[str, Any]:
    """(Re)form our core's group (the product's: :data:`NAMES.group`); bind it as ``group`` where the
    name is free or still the product's. ``bound`` says whether it was."""
    agent = _agent.AGENT
    ns = agent.shell.user_ns if agent else {}
    try:
        import mlx_jupyter.distributed as dist
    except Exception as exc:  # the native core is not built here
        return {"group": None, "group_error": f"mlx_jupyter.distributed unavailable: {exc}", "bound": False}
    if only_if_needed and NAMES.group is not None:
        g = NAMES.group
        return {"group": [g.rank(), g.size()], "group_error": "", "bound": NAMES.bind(ns, "group", g)}
    try:
        if NAMES.group is not None:
            dist.shutdown()
        g = dist.init(strict=this_rank_env().size > 1, timeout=timeout)
    except Exception as exc:
        if NAMES.owns(ns, "group"):
            del ns["group"]
        NAMES.group = None
        return {"group": None, "group_error": f"{type(exc).__name__}: {exc}", "bound": False}
    NAMES.group = g
    return {"group": [g.rank(), g.size()], "group_error": "", "bound": NAMES.bind(ns, "group", g)}


def mark_world_dead(reason: str, restart_advice: str = "") -> None:
    """The notebook says MLX's world is dead (shut down on some rank): cells using it are refused here."""
    NAMES.world_is_dead(reason, restart_advice)
