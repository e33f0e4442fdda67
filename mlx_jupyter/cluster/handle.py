"""MLX ranks as ipyparallel engines: the ``mlx`` engine-set launcher and :class:`Cluster`.

:class:`MLXEngineSetLauncher` (entry point ``mlx`` in
``ipyparallel.engine_launchers``) starts one engine per rank through
:class:`mlx_jupyter.launch.Launcher`, so each engine gets its rank's
environment contract (``MLX_RANK``, ``MLX_HOSTFILE`` ...), and the engine
requests engine id = rank (:mod:`mlx_jupyter.cluster.rank.engine`). Usable from plain
ipyparallel::

    ipp.Cluster(engines="mlx", n=2)

:class:`Cluster` is the handle for notebooks and scripts: an ipyparallel
controller set up for fast admission, the engines, a client, a view in rank
order, data movement, supervised cell runs (:mod:`mlx_jupyter.cluster.cells.run`),
restart with ids kept, and a stop that leaves no process behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_any
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import ipyparallel as ipp
from ipyparallel.cluster.launcher import EngineLauncher, NotRunning
from traitlets import Any as TAny
from traitlets import Dict, Integer, List, Unicode, default

from mlx_jupyter.cluster.cells.hub import CellHub
from mlx_jupyter.cluster.cells.wire import PORT_ENV
from mlx_jupyter.cluster.cells.text import describe_exit, rank_label
from mlx_jupyter.net.ports import free_port_block
from mlx_jupyter.cluster.cells.zmqwatch import watch_queues

# The ipyparallel Client's ZMQ streams that zmqwatch keeps flushed.
_CLIENT_STREAMS = ("_mux_stream", "_control_stream", "_iopub_stream", "_notification_stream", "_query_stream")

Progress = Callable[[int, int], None]
log = logging.getLogger(__name__)

#: controller options for fast admission: schedulers in threads (one process,
#: quick start), a 100 ms heartbeat (an engine is admitted on its first beat),
#: tolerant failure detection (5 s; rank deaths come from our launcher), no task DB.
FAST_CONTROLLER_ARGS = [
    "--usethreads",
    "--nodb",
    "--HeartMonitor.period=50",
    "--HeartMonitor.max_heartmonitor_misses=100",
]

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
#: "0" turns the direct cell channel off (cells then go through the controller)
CHANNEL_ENV = "MLX_JUPYTER_CELL_CHANNEL"
#: the ranks' matplotlib backend unless ``env`` sets MPLBACKEND (what an ipyparallel engine picks by itself)
RANK_MPLBACKEND = "module://matplotlib_inline.backend_inline"


class ClusterError(RuntimeError):
    """The cluster could not do what was asked; the message says which rank and why."""


#: how to get an ipyparallel whose internals this package uses (named in every compat error)
IPP_FIX = "install ipyparallel 9.x: pip install 'ipyparallel>=9,<10'"

#: ipyparallel 9's private names we rely on, by class: the client's sends and streams
#: (aborts and status go to a rank's control channel by hand), the launcher's hooks
_IPP_CLASS_NEEDS = {
    "Client": (ipp.Client, ("_build_targets", "_send", "send_execute_request", "_closed", "outstanding")),
    "EngineLauncher": (EngineLauncher, ("notify_start", "notify_stop", "get_env", "loop", "engine_cmd",
                                        "engine_args", "environment", "state")),
}
_IPP_CLIENT_ATTRS = ("_control_stream", "_mux_stream", "_query_stream", "_io_loop", "session")


def ipyparallel_problems(client: Any = None) -> list[str]:
    """The ipyparallel internals this package needs that are missing here (``[]``: none).

    With ``client``, its instance attributes (streams, I/O loop) are checked too.
    """
    missing = [f"{where}.{name}" for where, (cls, names) in _IPP_CLASS_NEEDS.items()
               for name in names if not hasattr(cls, name)]
    send = getattr(ipp.Client, "send_execute_request", None)
    if send is not None:
        import inspect

        if "message_future_hook" not in inspect.signature(send).parameters:
            missing.append("Client.send_execute_request(message_future_hook=)")
    try:
        from ipyparallel.controller.hub import Hub

        if not hasattr(Hub, "unregister_engine"):  # the handler of our unregistration_request
            missing.append("Hub.unregister_engine")
    except ImportError:
        missing.append("ipyparallel.controller.hub.Hub")
    if client is not None:
        missing += [f"Client().{name}" for name in _IPP_CLIENT_ATTRS if not hasattr(client, name)]
    return missing


def check_ipyparallel(client: Any = None) -> None:
    """Raise :class:`ClusterError` naming what is missing if this ipyparallel cannot be used."""
    missing = ipyparallel_problems(client)
    if missing:
        raise ClusterError(
            f"ipyparallel {getattr(ipp, '__version__', '?')} lacks what mlx_jupyter uses: "
            f"{', '.join(missing)}; {IPP_FIX}"
        )


def _is_local(host: str) -> bool:
    return host.split("@")[-1] in LOCAL_HOSTS


class MLXEngineSetLauncher(EngineLauncher):
    """ipyparallel engine set: one engine per MLX rank, started by our :class:`Launcher`.

    The number of engines is ``len(hosts) * repeat_hosts`` (like ``mlx.launch``),
    ipyparallel's ``n`` spread over ``hosts`` when ``repeat_hosts`` is 0, or the
    hostfile's length times ``repeat_hosts`` (see :meth:`layout`).
    """

    entrypoint_name = "mlx"

    hosts = List(Unicode(), default_value=["127.0.0.1"], config=True, help="hosts, one per rank (repeated)")
    hostfile = Unicode("", config=True, help="JSON hostfile; overrides hosts")
    repeat_hosts = Integer(0, config=True, help="ranks per host (0: n spread over hosts)")
    backend = Unicode("ring", config=True, help="ring, jaccl, jaccl-ring, nccl or mpi")
    python = Unicode(sys.executable, config=True, help="interpreter on the ranks")
    rank_cwd = Unicode("", config=True, help="working directory on every rank")
    starting_port = Integer(0, config=True, help="ring: first port (0: a free block, local hosts only)")
    connections_per_ip = Integer(1, config=True)
    rank_exit_callbacks = List(help="called as f(rank, returncode) when a rank's process ends")
    rank_output = Dict(help="rank -> last lines of its process output (engine logs, native stderr)")
    output_lines = Integer(200, config=True, help="lines of output kept per rank")
    ssh_options = TAny(None, allow_none=True, config=True,
                       help="mlx_jupyter.net.ssh.SSHOptions for remote hosts (None: OpenSSH defaults)")

    launcher = TAny(None, allow_none=True)

    @default("engine_cmd")
    def _default_engine_cmd(self) -> list[str]:
        return [self.python, "-m", "mlx_jupyter.cluster.rank.engine"]

    def layout(self, n: Optional[int] = None) -> tuple[int, int]:
        """(ranks per host, ranks) for ``n`` engines asked for: ``repeat_hosts`` wins, a
        hostfile repeats its hosts, else ``n`` is spread over ``hosts`` (at least one each)."""
        if self.hostfile:
            from mlx_jupyter.hostfile import read_hostfile

            repeat = max(self.repeat_hosts, 1)
            return repeat, len(read_hostfile(self.hostfile).hosts) * repeat
        repeat = self.repeat_hosts or max(1, (n or 1) // max(len(self.hosts), 1))
        return repeat, len(self.hosts) * repeat

    @property
    def engine_count(self) -> int:
        """What ipyparallel's ``Cluster(n=...)`` starts (it asks this before ``start``)."""
        return self.layout(getattr(self.parent, "n", None))[1]

    def find_args(self) -> list[str]:
        return list(self.engine_cmd) + list(self.engine_args)

    def start(self, n: Optional[int] = None) -> list[Optional[int]]:
        from mlx_jupyter.launch import Launcher

        self.loop  # noqa: B018  (bind the ipyparallel loop on this thread, as ipyparallel's launchers do)
        hosts: Any = self.hostfile or ",".join(self.hosts)
        repeat, count = self.layout(n)
        self.n = count
        port = self.starting_port
        if not port:
            if not self.hostfile and all(_is_local(h) for h in self.hosts):
                port = free_port_block(count * max(self.connections_per_ip, 1))
            else:
                port = 32323
        env = dict(self.get_env())
        env.update({"MLX_JUPYTER_BACKEND": self.backend, "MLX_JUPYTER_SIZE": str(count)})
        # every rank the same plots, local or remote: not whatever backend the notebook's kernel had
        env.setdefault("MPLBACKEND", RANK_MPLBACKEND)
        self.rank_output = {r: [] for r in range(count)}
        self.launcher = Launcher(
            command=self.find_args(),
            hosts=hosts,
            repeat_hosts=repeat,
            backend=self.backend,
            env=env,
            cwd=self.rank_cwd or None,
            python=self.python,
            starting_port=port,
            connections_per_ip=self.connections_per_ip,
            on_output=self._on_output,
            on_exit=self._on_exit,
            terminate_on_failure=False,
            ssh_options=self.ssh_options,
        )
        self.launcher.start()
        pids = [r.pid for r in self.launcher.ranks]
        self.notify_start(pids)
        return pids

    def _on_output(self, rank: int, stream: str, line: str) -> None:
        lines = self.rank_output.setdefault(rank, [])
        lines.append(line)
        del lines[: -self.output_lines]

    def _on_exit(self, rank: int, returncode: int) -> None:
        for cb in list(self.rank_exit_callbacks):
            try:
                cb(rank, returncode)
            except Exception:
                self.log.exception("rank exit callback failed")
        from mlx_jupyter.launch.rankinfo import LOST

        ranks = self.launcher.ranks if self.launcher else []
        # a rank being stopped counts as done (KILLED) before its process has ended
        if ranks and all(r.done and (r.returncode is not None or r.state == LOST) for r in ranks):
            data = self.stop_data_now()
            self.loop.add_callback(lambda: self.notify_stop(data))

    def stop_data_now(self) -> dict:
        """What ipyparallel is told once every rank has ended: ``exit_code`` is that of the
        first rank that ended by itself with a nonzero code, 0 when every such rank was
        stopped by us (stop, restart: listed in ``stopped``); every rank's code in ``ranks``.

        ipyparallel logs a nonzero code as a warning, with the ranks' whole output.
        """
        from mlx_jupyter.launch.rankinfo import KILLED

        ranks = self.launcher.ranks if self.launcher else []
        own = [r for r in ranks if r.done and r.state != KILLED and r.returncode != 0]
        data: dict[str, Any] = {
            "exit_code": next((255 if r.returncode is None else r.returncode for r in own), 0),
            "ranks": {r.rank: r.returncode for r in ranks},
        }
        stopped = [r.rank for r in ranks if r.state == KILLED]
        if stopped:
            data["stopped"] = stopped
        return data

    def signal(self, sig: int) -> None:
        if self.launcher is not None:
            self.launcher.signal(sig)

    async def stop(self) -> None:
        if self.launcher is not None:
            await self.launcher.astop(timeout=2.0)
        if self.state != "after":
            self.notify_stop(self.stop_data_now() if self.launcher is not None else {"exit_code": 0})

    def get_output(self, remove: bool = False) -> str:
        return "\n".join(f"[rank {r}] {line}" for r, lines in self.rank_output.items() for line in lines)

    @classmethod
    def from_dict(cls, d: dict, **kwargs: Any) -> "MLXEngineSetLauncher":
        raise NotRunning("MLX ranks belong to the process that launched them")


class Cluster:
    """MLX ranks as ipyparallel engines, engine id = rank. A context manager.

    ``n`` ranks per host (like ``mlx.launch -n``); ``hosts`` a list or
    ``"h1,h2"`` (default one local host), or ``hostfile``. ``env`` is added to
    every rank's environment. ``ssh_options`` (:class:`mlx_jupyter.net.ssh.SSHOptions`)
    say how to reach remote hosts. With remote hosts the controller listens on
    every interface and tells the engines this machine's name; pass
    ``controller_ip`` (an address of this machine the hosts can reach) when
    that name does not resolve to such an address on the hosts.
    ``cell_channel``: send cells straight to the ranks, beside the controller
    (:mod:`mlx_jupyter.cluster.cells.hub`); default on unless ``MLX_JUPYTER_CELL_CHANNEL=0``.
    """

    def __init__(
        self,
        n: int = 2,
        hosts: Optional[Sequence[str] | str] = None,
        hostfile: Optional[str] = None,
        backend: str = "ring",
        python: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        starting_port: int = 0,
        controller_ip: Optional[str] = None,
        timeout: float = 60.0,
        log_level: int = logging.WARNING,
        ssh_options: Optional[Any] = None,
        cell_channel: Optional[bool] = None,
    ):
        if hosts and hostfile:
            raise ValueError("give hosts or hostfile, not both (the hostfile lists the hosts)")
        if isinstance(hosts, str):
            hosts = [h.strip() for h in hosts.split(",")]
        self.hosts = list(hosts or ["127.0.0.1"])
        if any(not h for h in self.hosts):
            raise ValueError("empty host name in hosts")
        self.hostfile = hostfile
        self.n = int(n)
        if self.n < 1:
            raise ValueError(f"n must be at least 1 rank per host, got {n}")
        self.backend = backend
        self.python = python or sys.executable
        self.env = dict(env or {})
        self.cwd = cwd
        self.starting_port = starting_port
        self.local = hostfile is None and all(_is_local(h) for h in self.hosts)
        self.controller_ip = controller_ip or (None if self.local else "*")
        self.timeout = timeout
        self.log_level = log_level
        self.ssh_options = ssh_options
        self.cluster_id = f"mlx-{secrets.token_hex(4)}"
        self.client: Optional[ipp.Client] = None
        self.ipp: Optional[ipp.Cluster] = None
        self.size = 0
        self.dead: dict[int, Optional[int]] = {}
        self.busy: dict[int, Any] = {}
        self.needs_reform = False
        self.ready_ns = False
        self.queue_kicks = 0  # messages our watch found left unread in the client's sockets
        self.setup_info: dict[int, dict] = {}
        self.ready_time: Optional[float] = None
        self._world_ar: Any = None  # the ranks forming MLX's world after start (see _begin_world)
        self._runs: set = set()
        self._stopping = False
        self._changed = threading.Event()
        self._engine_set_id: Optional[str] = None
        self._controller_pids: list[int] = []
        self.rank_exit_callbacks: list[Callable[[int, Optional[int]], None]] = []
        if cell_channel is None:
            cell_channel = os.environ.get(CHANNEL_ENV, "1") != "0"
        self.cell_channel = cell_channel
        self.hub: Optional[CellHub] = None

    def expected_size(self) -> int:
        """How many ranks :meth:`start` will start (the hostfile is read for its length)."""
        if self.hostfile:
            from mlx_jupyter.hostfile import read_hostfile

            return len(read_hostfile(self.hostfile).hosts) * self.n
        return len(self.hosts) * self.n

    # ------------------------------------------------------------ lifecycle

    def _config(self) -> Any:
        from traitlets.config import Config

        cfg = Config()
        es = cfg.MLXEngineSetLauncher
        if self.hostfile:
            es.hostfile = self.hostfile
        es.hosts = self.hosts
        es.repeat_hosts = self.n
        es.backend = self.backend
        es.python = self.python
        es.environment = dict(self.env)
        if self.hub is not None:
            es.environment[PORT_ENV] = str(self.hub.port)
        es.starting_port = self.starting_port
        if self.cwd:
            es.rank_cwd = self.cwd
        if self.ssh_options is not None:
            es.ssh_options = self.ssh_options
        es.engine_args = ["--IPEngine.wait_for_url_file=30", "--IPEngine.timeout=30"]
        cfg.LocalControllerLauncher.controller_cmd = [sys.executable, "-m", "mlx_jupyter.cluster.controller"]
        cfg.LocalControllerLauncher.stop_seconds_until_kill = 2
        return cfg

    def start(self, progress: Optional[Progress] = None, timeout: Optional[float] = None) -> "Cluster":
        """Start controller and ranks; return once every rank's engine is connected with id = rank."""
        if self.ipp is not None:
            raise ClusterError("this cluster is already running; stop() or restart() it")
        check_ipyparallel()
        t0 = time.perf_counter()
        timeout = self.timeout if timeout is None else timeout
        self._stopping = False
        if self.cell_channel and self.hub is None:
            self.hub = CellHub(self._hub_ip())
        self.ipp = ipp.Cluster(
            cluster_id=self.cluster_id,
            engine_launcher_class=MLXEngineSetLauncher,
            controller_args=list(FAST_CONTROLLER_ARGS),
            controller_ip=self.controller_ip or "",
            send_engines_connection_env=not self.local,
            log_level=self.log_level,
            config=self._config(),
            shutdown_atexit=True,
        )
        try:
            self.ipp.start_controller_sync()
            self._controller_pids = self._process_tree(self.ipp.controller.pid)
            if self.local:  # engines start now and pick up the connection file when it appears
                self._start_engines()
                self._connect_client()
            else:  # remote engines get the connection info in their environment
                self._connect_client()
                self._start_engines()
            self._wait_for_ranks(progress, timeout)
        except BaseException:
            self.stop()
            raise
        self.ready_time = time.perf_counter() - t0
        self._publish()
        return self

    def _hub_ip(self) -> str:
        """Where the cell channel listens: beside the controller (all interfaces for remote ranks)."""
        if self.local:
            return "127.0.0.1"
        return self.controller_ip if self.controller_ip not in (None, "", "*", "0.0.0.0") else "*"

    def cell_hub(self, ranks: Optional[Sequence[int]] = None) -> Optional[CellHub]:
        """The direct cell channel for a cell on ``ranks``, if this cluster has one (see
        :mod:`mlx_jupyter.cluster.cells.hub`) and no request through the controller is still running
        on those ranks: a cell sent beside it could overtake it."""
        if self.hub is None or self.client is None:
            return None
        if ranks and self._controller_requests_on(ranks):
            return None
        return self.hub

    def _controller_requests_on(self, ranks: Sequence[int]) -> bool:
        """Whether a request sent through the controller (``%px``, a non-blocking apply) is
        unanswered on one of ``ranks`` (unknowable: True)."""
        client = self.client
        outstanding = getattr(client, "_outstanding_dict", None)
        engines = getattr(client, "_engines", None)
        if outstanding is None or engines is None:
            return True
        return any(outstanding.get(engines.get(r)) for r in ranks)

    def _publish(self) -> None:
        """List this cluster for the lab panel (a file in Jupyter's runtime dir); never fails start."""
        try:
            from mlx_jupyter.cluster import registry

            registry.publish(self)
        except Exception as exc:
            log.warning("could not publish cluster %s for the lab panel: %s", self.cluster_id, exc)

    def _unpublish(self) -> None:
        try:
            from mlx_jupyter.cluster import registry

            registry.unpublish(self.cluster_id)
        except Exception as exc:
            log.warning("could not unpublish cluster %s: %s", self.cluster_id, exc)

    def _start_engines(self) -> None:
        assert self.ipp is not None
        self.dead.clear()
        self.busy.clear()
        self._engine_set_id = self.ipp.start_engines_sync(rank_exit_callbacks=[self._on_rank_exit])
        self.size = self.engine_set.n
        self._controller_pids = sorted(set(self._controller_pids) | set(self._process_tree(self.ipp.controller.pid)))

    @property
    def engine_set(self) -> MLXEngineSetLauncher:
        assert self.ipp is not None and self._engine_set_id is not None
        return self.ipp.engines[self._engine_set_id]

    def _wait_for_ranks(self, progress: Optional[Progress], timeout: float) -> None:
        assert self.client is not None
        deadline = time.monotonic() + timeout
        wanted = set(range(self.size))
        last = -1
        while True:
            ids = set(self.client.ids)
            have = len(ids & wanted)
            if have != last and progress:
                progress(have, self.size)
            last = have
            if ids >= wanted:
                break
            if ids - wanted:
                raise ClusterError(f"engines registered with ids {sorted(ids - wanted)}, not their ranks")
            if self.dead:
                raise ClusterError(self._dead_message("did not start", tail=True))
            if time.monotonic() > deadline:
                missing = sorted(wanted - ids)
                raise ClusterError(
                    f"{rank_label(missing)} not connected after {timeout:g} s\n{self._tail(missing)}"
                )
            self._changed.wait(0.01)
            self._changed.clear()
        self._probe_channels(deadline)
        self._begin_world()

    def _probe_channels(self, deadline: float, patience: float = 0.05, most: float = 0.2) -> None:
        """Until every rank has answered on its request channel (the one cells use),
        saying that its rank agent is installed.

        The controller routes to an engine by identity and silently drops what
        reaches it before that engine's own connection is up; ipyparallel lists an
        engine once its heartbeat arrives, which need not come after. A probe that
        gets no answer within ``patience`` s is sent again, the patience doubling up
        to ``most`` s (the connection is usually up a few ms later; a loaded machine
        gets longer), so the first cell never goes to a rank that cannot hear it.
        (Control needs no probe: status and abort are used with timeouts and
        deadlines.) The agent is installed before the engine handles its first
        request, so the answer is final.
        """
        from mlx_jupyter.cluster.rank import agent as rankside

        client = self.client
        assert client is not None
        pending = set(range(self.size))
        answers: dict[int, dict] = {}
        sent: dict[int, list] = {rank: [] for rank in pending}
        while pending:
            for rank in pending:
                sent[rank].append(client.direct_view(targets=rank).apply_async(rankside.agent_state))
            until = min(deadline, time.monotonic() + patience)
            patience = min(patience * 2, most)
            while pending and not self.dead:
                for rank in list(pending):
                    done = [f for f in sent[rank] if f.done()]  # an earlier probe may be the one that got through
                    if done:
                        try:
                            answers[rank] = done[0].result(0)
                        except Exception as exc:  # the rank could not run the probe at all
                            answers[rank] = {"installed": False, "error": f"the probe failed: {exc}"}
                        pending.discard(rank)
                left = until - time.monotonic()
                if not pending or left <= 0:
                    break
                wait_any([f for r in pending for f in sent[r]], left, FIRST_COMPLETED)
            if self.dead:
                raise ClusterError(self._dead_message("did not start", tail=True))
            if pending and time.monotonic() > deadline:
                raise ClusterError(f"{rank_label(sorted(pending))} registered but never answered a request")
        bad = {r: a for r, a in sorted(answers.items()) if not a.get("installed")}
        if bad:
            lines = [f"rank {r}: the rank agent (abort, status) is not installed: {a.get('error')} "
                     f"(ipyparallel {a.get('ipyparallel', '?')} there)" for r, a in bad.items()]
            raise ClusterError("\n".join(lines) + f"\n{IPP_FIX} on the ranks' Python")
        self._await_cell_channel(answers, deadline)

    def _await_cell_channel(self, answers: dict[int, dict], deadline: float, most: float = 2.0) -> None:
        """Until every rank has said hello on the cell channel; cells to a rank that has not take
        the controller's path (slower, same results), and the log says why."""
        if self.hub is None:
            return
        missing = self.hub.wait_connected(self.ranks, max(0.0, min(deadline - time.monotonic(), most)))
        if missing:
            why = "; ".join(f"rank {r}: {answers.get(r, {}).get('channel_error') or 'no hello'}" for r in missing)
            log.warning("%s not on the direct cell channel (%s): cells go through the controller",
                        rank_label(missing), why)

    def _begin_world(self) -> None:
        """Ask every rank to begin forming MLX's world now, in the background (ring only).

        Not waited for: each rank answers once its part of the ring has formed (MLX's
        init holds the rank's GIL meanwhile: see :meth:`forming_world`); the first
        cell's setup takes the world over.
        """
        from mlx_jupyter.cluster.rank import agent as rankside

        self._world_ar = None
        if self.backend != "ring" or self.size < 2 or self.client is None:
            return
        try:
            self._world_ar = self.client.direct_view(targets=self.ranks).apply_async(rankside.start_world_early)
        except Exception as exc:  # the first cell forms it instead
            log.warning("could not ask the ranks to form MLX's world early: %s", exc)

    def _dead_message(self, what: str, tail: bool = False) -> str:
        lines = [f"rank {r} {what}: {describe_exit(rc)}" for r, rc in sorted(self.dead.items())]
        if tail:
            lines.append(self._tail(sorted(self.dead)))
        return "\n".join(line for line in lines if line)

    def _tail(self, ranks: Iterable[int], n: int = 15) -> str:
        try:
            out = self.engine_set.rank_output
        except Exception:
            return ""
        parts = []
        for r in ranks:
            lines = out.get(r, [])[-n:]
            if lines:
                parts.append(f"last output of rank {r}:\n  " + "\n  ".join(lines))
        job = out.get(-1, [])[-n:]  # the launcher's own (mpirun's) output, not one rank's
        if job:
            parts.append("last output of the launcher:\n  " + "\n  ".join(job))
        return "\n".join(parts)

    def _on_rank_exit(self, rank: int, returncode: Optional[int]) -> None:
        """A rank's process ended (launcher thread)."""
        if self._stopping:
            return
        self.dead[rank] = returncode
        self._changed.set()
        if self.hub is not None:
            self.hub.forget([rank])
        self._unregister([rank])
        for run in list(self._runs):
            run.rank_died(rank, returncode)
        for cb in list(self.rank_exit_callbacks):
            try:
                cb(rank, returncode)
            except Exception:
                pass

    def _unregister(self, ranks: Iterable[int]) -> None:
        """Tell the hub these engines are gone, so that their ids are free at once."""
        client = self.client
        if client is None or client._closed:
            return
        for rank in ranks:
            client._io_loop.add_callback(
                lambda r=rank: client.session.send(client._query_stream, "unregistration_request", content={"id": r})
            )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every rank, the controller and the client; leave no process behind."""
        self._stopping = True
        self._unpublish()
        for run in list(self._runs):
            run.interrupt("the cluster is stopping")
        pids = set(self._controller_pids)
        if self.ipp is not None and self.ipp.controller is not None:
            pids.update(self._process_tree(self.ipp.controller.pid))
        try:
            for es in list(self.ipp.engines.values()) if self.ipp else []:
                if es.launcher is not None:
                    pids.update(self._rank_pids(es))
        except Exception:
            pass
        if self.client is not None:
            try:
                self.client.close(linger=0)
            except Exception:
                pass
            self.client = None
        if self.hub is not None:
            self.hub.close()
            self.hub = None
        if self.ipp is not None:
            try:
                self.ipp.stop_cluster_sync()
            except Exception:
                pass
            self.ipp = None
        _reap(pids, timeout)
        self.size = 0
        self.ready_ns = False
        self.setup_info = {}
        self.dead.clear()
        self.busy.clear()

    def _await_controller(self, timeout: float = 30.0) -> None:
        """Until the controller's connection files are written (ipyparallel polls only every 0.1 s)."""
        from mlx_jupyter.cluster.rank.agent import await_json_file

        controller = self.ipp.controller
        end = time.monotonic() + timeout
        for path in getattr(controller, "connection_files", {}).values():
            while not await_json_file(path, 0.05):
                if controller.poll() is not None or time.monotonic() > end:
                    return  # ipyparallel's own wait says what went wrong

    def _connect_client(self) -> None:
        """The ipyparallel client, with its streams watched for messages left unread."""
        self._await_controller()
        self.client = c = self.ipp.connect_client_sync()
        if isinstance(c, ipp.Client):  # its streams exist only once it is connected
            check_ipyparallel(c)
            if self.hub is not None:
                self.hub.start(c.session)
        watch_queues([getattr(c, name, None) for name in _CLIENT_STREAMS], self._kicked)

    def _kicked(self, stream: Any) -> None:
        self.queue_kicks += 1

    def restart(self, progress: Optional[Progress] = None, timeout: Optional[float] = None) -> "Cluster":
        """Fresh processes for every rank, same ranks, same engine ids; the controller stays."""
        if self.ipp is None or self.client is None:
            return self.start(progress, timeout)
        timeout = self.timeout if timeout is None else timeout
        self._stopping = True
        for run in list(self._runs):
            run.interrupt("the cluster is restarting")
        pids = self._rank_pids(self.engine_set)
        if self.hub is not None:
            self.hub.forget()
        self.ipp.stop_engines_sync()
        _reap(pids, 5.0)
        self._unregister(range(self.size))
        deadline = time.monotonic() + 5.0
        while set(self.client.ids) and time.monotonic() < deadline:
            time.sleep(0.01)
        if set(self.client.ids):
            raise ClusterError(f"the controller still lists engines {sorted(self.client.ids)} after stopping them")
        self._stopping = False
        self.ready_ns = False
        self.needs_reform = False
        self.setup_info = {}
        self._start_engines()
        self._wait_for_ranks(progress, timeout)
        self._publish()  # new pids
        return self

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @staticmethod
    def _process_tree(pid: Optional[int]) -> list[int]:
        if not pid or pid < 0:
            return []
        try:
            import psutil

            proc = psutil.Process(pid)
            return [pid] + [c.pid for c in proc.children(recursive=True)]
        except Exception:
            return [pid]

    def _rank_pids(self, es: MLXEngineSetLauncher) -> set[int]:
        pids: set[int] = set()
        if es.launcher is None:
            return pids
        for info in es.launcher.ranks:
            if info.pid and _is_local(info.host):
                pids.update(self._process_tree(info.pid))
        return pids

    # ------------------------------------------------------------ state

    @property
    def running(self) -> bool:
        return self.client is not None

    @property
    def ranks(self) -> list[int]:
        return list(range(self.size))

    @property
    def view(self) -> Any:
        """A blocking DirectView over every rank, in rank order."""
        self._need_client()
        view = self.client.direct_view(targets=self.ranks)
        view.block = True
        return view

    def _need_client(self) -> ipp.Client:
        if self.client is None:
            raise ClusterError("no cluster is running: start one with %mlx_cluster start (or Cluster.start())")
        return self.client

    def check_ranks(self, ranks: Sequence[int]) -> None:
        """Raise a clear error if a rank is dead or still busy with an earlier cell."""
        self._need_client()
        dead = [r for r in ranks if r in self.dead]
        if dead:
            raise ClusterError(self._dead_message("is dead") + "\nrestart the ranks: %mlx_cluster restart")
        busy = [r for r in ranks if r in self.busy and not self.busy[r].done()]
        if busy:
            raise ClusterError(
                f"{rank_label(busy)} still running an earlier cell that did not stop; "
                "interrupt it, or %mlx_cluster restart"
            )
        for r in ranks:
            self.busy.pop(r, None)

    # ------------------------------------------------------------ running code

    def wait(self, ar: Any, timeout: Optional[float], ranks: Sequence[int], what: str = "the request") -> Any:
        """Wait for an AsyncResult; fail at once if one of ``ranks`` dies, or after ``timeout``.

        A KeyboardInterrupt (the stop button) stops the request on the ranks too
        (:meth:`_stop_request`) before it is raised again.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not ar.ready():
                dead = [r for r in ranks if r in self.dead]
                if dead:
                    raise ClusterError(self._dead_message(f"died during {what}"))
                if deadline is not None and time.monotonic() > deadline:
                    raise ClusterError(f"{what} did not finish within {timeout:g} s")
                ar.wait(0.05)
        except KeyboardInterrupt:
            left = self._stop_request(ar, ranks, f"{what} interrupted by the user")
            note = f"; {rank_label(left)} did not stop yet (busy)" if left else ""
            raise KeyboardInterrupt(f"{what} interrupted; stopped on the ranks{note}") from None
        return ar.get()

    def _stop_request(self, ar: Any, ranks: Sequence[int], reason: str, grace: float = 2.0) -> list[int]:
        """Abort ``ar``'s request on every rank (queued ones never run); the ranks still busy after ``grace`` s."""
        msg_ids = dict(zip(ranks, getattr(ar, "msg_ids", [])))
        self.send_abort(reason, ranks, msg_ids)
        self.needs_reform = True
        end = time.monotonic() + grace
        while not ar.ready() and time.monotonic() < end:
            ar.wait(0.05)
        client = self.client
        left = [r for r, m in msg_ids.items() if client is not None and m in client.outstanding]
        for rank in left:
            self.busy[rank] = _Outstanding(client, msg_ids[rank])
        return left

    def setup(self, world: bool = True, group: bool = True, timeout: float = 60.0) -> dict[int, dict]:
        """Define ``mx``, ``world`` and ``group`` on every rank (all at once: the ring forms)."""
        from mlx_jupyter.cluster.rank import agent as rankside

        self.check_ranks(self.ranks)
        view = self.client.direct_view(targets=self.ranks)
        ar = view.apply_async(rankside.setup, self.backend, world, group, timeout)
        infos = self.wait(ar, timeout + 5, self.ranks, "setup of mx/world/group")
        self.setup_info = dict(zip(self.ranks, infos))
        self.ready_ns = True
        self.needs_reform = False
        return self.setup_info

    def reform(self, timeout: float = 10.0, attempts: int = 2) -> dict[int, dict]:
        """Form our core's ``group`` afresh on every rank (after an abort); retried once."""
        for attempt in range(attempts):
            try:
                return self._reform(timeout)
            except ClusterError:
                if attempt + 1 == attempts:
                    raise
        raise AssertionError("unreachable")

    def _reform(self, timeout: float) -> dict[int, dict]:
        from mlx_jupyter.cluster.rank import agent as rankside

        self.check_ranks(self.ranks)
        view = self.client.direct_view(targets=self.ranks)
        ar = view.apply_async(rankside.reform, timeout)
        infos = self.wait(ar, timeout + 5, self.ranks, "re-forming group")
        for r, info in zip(self.ranks, infos):
            self.setup_info.setdefault(r, {}).update(info)
        errors = {r: i["group_error"] for r, i in zip(self.ranks, infos) if i.get("group_error")}
        if errors:
            raise ClusterError("re-forming `group` failed: " + "; ".join(f"rank {r}: {e}" for r, e in errors.items()))
        self.needs_reform = False
        return self.setup_info

    def run(self, code: str, targets: Optional[Sequence[int]] = None, release_deadline: float = 2.0) -> Any:
        """Start a supervised run of ``code`` on ``targets`` (default all); see :class:`CellRun`."""
        from mlx_jupyter.cluster.cells.run import CellRun

        ranks = list(self.ranks if targets is None else targets)
        self.check_ranks(ranks)
        return CellRun(self, code, ranks, release_deadline).start()

    def send_abort(self, reason: str, ranks: Sequence[int],
                   msg_ids: Optional[dict[int, str]] = None) -> dict[int, Any]:
        """``mlx_abort_request`` to each rank's control channel; futures of the replies.

        ``msg_ids`` (rank -> request) names the cell to stop on each rank: one that
        has not started there yet is then never run.
        """
        client = self.client
        futures: dict[int, Any] = {}
        if client is None or client._closed:
            return futures
        for rank in ranks:
            if rank in self.dead or rank not in client.ids:
                continue
            ident = client._build_targets([rank])[0][0]
            content = {"reason": reason, "msg_id": (msg_ids or {}).get(rank, "")}
            futures[rank] = client._send(client._control_stream, "mlx_abort_request", content=content, ident=ident)
        return futures

    def abort(self, reason: str = "aborted by the user", targets: Optional[Sequence[int]] = None,
              timeout: float = 2.0) -> dict[int, bool]:
        """Abort whatever runs on ``targets``; rank -> whether a cell was running there."""
        futures = self.send_abort(reason, self.ranks if targets is None else targets)
        self.needs_reform = True
        out = {}
        for rank, fut in futures.items():
            try:
                out[rank] = bool(fut.result(timeout)["content"].get("was_running"))
            except Exception:
                out[rank] = False
        return out

    def forming_world(self) -> list[int]:
        """The ranks still forming MLX's world begun after start (they answer nothing meanwhile)."""
        ar, client = self._world_ar, self.client
        if ar is None or client is None:
            return []
        return [r for r, m in zip(self.ranks, getattr(ar, "msg_ids", [])) if m in client.outstanding]

    def status(self, timeout: float = 1.0, forming_grace: float = 2.0) -> list[dict]:
        """One row per rank: rank, host, pid, state, backend, memory (bytes), and what the rank says.

        ``cell_started`` is when the rank's current cell began (wall clock, ``time.time()``;
        a remote rank's shifted to this machine's clock), None when idle. Just after start,
        while ranks still form MLX's world, it first waits up to ``forming_grace`` s for them.
        """
        rows = []
        client = self.client
        infos = {i.rank: i for i in (self.engine_set.launcher.ranks if self.ipp and self._engine_set_id else [])}
        futures = {}
        if self.forming_world():  # just started: a moment more gives the ranks' real state
            try:
                self._world_ar.wait(forming_grace)
            except Exception:
                pass
        if client is not None:
            for rank in self.ranks:
                if rank in self.dead or rank not in client.ids:
                    continue
                ident = client._build_targets([rank])[0][0]
                futures[rank] = client._send(client._control_stream, "mlx_status_request", content={}, ident=ident)
        deadline = time.monotonic() + timeout
        for rank in self.ranks:
            info = infos.get(rank)
            row = {"rank": rank, "host": info.host if info else "?", "pid": info.pid if info else None,
                   "state": "dead" if rank in self.dead else (info.state if info else "?"),
                   "backend": self.backend, "memory": None, "cell_started": None}
            fut = futures.get(rank)
            if fut is not None:
                try:
                    reply = fut.result(max(0.0, deadline - time.monotonic()))["content"]
                    row.update(memory=reply.get("rss"), busy=reply.get("executing"),
                               world_closed=reply.get("world_closed", ""), group=reply.get("group"),
                               cell_started=_local_clock(reply, info is None or _is_local(info.host)))
                    row["state"] = "busy" if reply.get("executing") else "idle"
                    if rank in self.forming_world():
                        row.update(state="forming MLX world", busy=False, cell_started=None)
                except Exception:
                    row["state"] = "forming MLX world" if rank in self.forming_world() else "no reply"
            elif rank in self.dead:
                row["state"] = f"dead ({describe_exit(self.dead[rank])})"
            rows.append(row)
        return rows

    # ------------------------------------------------------------ data

    def push(self, ns: Mapping[str, Any], targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> None:
        """Define the names of ``ns`` in every target rank's namespace."""
        ranks = list(self.ranks if targets is None else targets)
        self.check_ranks(ranks)
        ar = self.client.direct_view(targets=ranks).push(dict(ns), block=False)
        self.wait(ar, timeout, ranks, "push")

    def pull(self, names: str | Sequence[str], targets: Optional[Sequence[int]] = None,
             timeout: float = 60.0) -> list[Any]:
        """The value(s) of ``names`` on each target rank, in rank order."""
        ranks = list(self.ranks if targets is None else targets)
        self.check_ranks(ranks)
        ar = self.client.direct_view(targets=ranks).pull(names, block=False)
        out = self.wait(ar, timeout, ranks, "pull")
        return list(out) if len(ranks) > 1 or isinstance(out, list) else [out]

    def scatter(self, name: str, seq: Any, targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> None:
        """Split ``seq`` into consecutive parts, part r bound to ``name`` on rank r."""
        ranks = list(self.ranks if targets is None else targets)
        self.check_ranks(ranks)
        ar = self.client.direct_view(targets=ranks).scatter(name, seq, block=False)
        self.wait(ar, timeout, ranks, "scatter")

    def gather(self, name: str, targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> Any:
        """Concatenate ``name`` from every rank, in rank order."""
        ranks = list(self.ranks if targets is None else targets)
        self.check_ranks(ranks)
        ar = self.client.direct_view(targets=ranks).gather(name, block=False)
        return self.wait(ar, timeout, ranks, "gather")


def _local_clock(reply: Mapping[str, Any], same_clock: bool) -> Optional[float]:
    """The reply's ``cell_started`` (None unless busy) in this machine's clock: a remote rank's
    clock is shifted by its offset from ours, as seen in its reply's ``time`` (within the reply's latency)."""
    started = reply.get("cell_started") if reply.get("executing") else None
    if not isinstance(started, (int, float)):
        return None
    rank_now = reply.get("time")
    if same_clock or not isinstance(rank_now, (int, float)):
        return float(started)
    return float(started) + (time.time() - rank_now)


class _Outstanding:
    """A request the client still waits for, as :meth:`Cluster.check_ranks` asks (``done()``)."""

    def __init__(self, client: Any, msg_id: str):
        self.client, self.msg_id = client, msg_id

    def done(self) -> bool:
        return self.msg_id not in self.client.outstanding


def _reap(pids: Iterable[int], timeout: float) -> None:
    """Make sure these processes are gone: SIGTERM what is left, then SIGKILL."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return
    procs = []
    for pid in set(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    if not alive:
        return
    _, alive = psutil.wait_procs(alive, timeout=min(timeout, 1.0))
    for send, grace in ((psutil.Process.terminate, min(timeout, 2.0)), (psutil.Process.kill, 1.0)):
        for p in alive:
            try:
                send(p)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(alive, timeout=grace)
