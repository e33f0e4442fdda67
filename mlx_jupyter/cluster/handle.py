"""The notebook's handle on MLX ranks as ipyparallel engines: :class:`Cluster`.

An ipyparallel controller set up for fast admission, the engines (the ``mlx`` engine set,
:mod:`mlx_jupyter.cluster.engineset`), a client, a view in rank order, restart with ids kept,
and a stop that leaves no process behind. Readiness, supervision, control calls and data
movement are in the modules of the same names, mixed into :class:`Cluster`.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import ipyparallel as ipp

from mlx_jupyter.cluster.cells.hub import CellHub
from mlx_jupyter.cluster.shared.wire import PORT_ENV
from mlx_jupyter.cluster.shared.zmqwatch import watch_queues
from mlx_jupyter.cluster.control import Control
from mlx_jupyter.cluster.data import Data
from mlx_jupyter.cluster.engineset import MLXEngineSetLauncher
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.shared.ipp_compat import (
    IPP_FIX, check_ipyparallel, client_streams, ipyparallel_problems, preload_serializer, requests_outstanding,
    unregister,
)
from mlx_jupyter.cluster.processes import process_tree, rank_pids, reap
from mlx_jupyter.cluster.readiness import ProgressCallback, Readiness
from mlx_jupyter.cluster.supervision import Supervision
from mlx_jupyter.net.hosts import LOCAL_HOSTS, is_local

__all__ = ["Cluster", "ClusterError", "MLXEngineSetLauncher", "IPP_FIX", "check_ipyparallel",
           "ipyparallel_problems", "FAST_CONTROLLER_ARGS", "LOCAL_HOSTS", "CHANNEL_ENV"]

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

#: "0" turns the direct cell channel off (cells then go through the controller)
CHANNEL_ENV = "MLX_JUPYTER_CELL_CHANNEL"


def _settings(hostfile: Optional[str], backend: Optional[str], env: Optional[Mapping[str, str]]) -> Any:
    """Backend and env from the hostfile (read now, so that a bad one fails here) and the explicit ones."""
    from mlx_jupyter.hostfile import merge_settings, read_hostfile

    hf = read_hostfile(hostfile) if hostfile else None
    return merge_settings(hf, f"hostfile {hostfile}", backend, env)


class Cluster(Readiness, Supervision, Control, Data):
    """MLX ranks as ipyparallel engines, engine id = rank. A context manager.

    ``n`` ranks per host (like ``mlx.launch -n``); ``hosts`` a list or
    ``"h1,h2"`` (default one local host), or ``hostfile``. ``env`` is added to
    every rank's environment. A hostfile's ``backend`` and ``envs`` apply unless
    ``backend``/``env`` say otherwise (a notice names each override); else ring. ``ssh_options`` (:class:`mlx_jupyter.net.ssh.SSHOptions`)
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
        backend: Optional[str] = None,
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
        self.python = python or sys.executable
        settings = _settings(hostfile, backend, env)
        self.backend, self.env, self.notices = settings.backend, settings.env, settings.notices
        for notice in self.notices:
            print(f"mlx-jupyter: {notice}", file=sys.stderr)
        self.cwd = cwd
        self.starting_port = starting_port
        self.local = hostfile is None and all(is_local(h) for h in self.hosts)
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
        self._stray_probes: set[str] = set()  # start's probes the controller dropped (see _probe_channels)
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
        self.owner: Optional[dict[str, Any]] = None  # set by connect(): the process that owns the ranks
        self._rank_watch: Any = None

    @classmethod
    def connect(cls, cluster_id: Optional[str] = None, timeout: float = 30.0) -> "Cluster":
        """A handle on a running cluster another process started (the lab panel, another kernel).

        Cells, push/pull, status and abort work as on a cluster of one's own (through the
        controller); restart and stop of the processes stay with the owner, and :meth:`stop`
        only disconnects. ``cluster_id`` may be omitted when exactly one cluster is running.
        """
        from mlx_jupyter.cluster import attach

        return attach.connect(cls, cluster_id, timeout)

    def owner_text(self) -> str:
        owner = self.owner or {}
        return f"{owner.get('owner', 'another process')} (pid {owner.get('owner_pid', '?')})"

    def expected_size(self) -> int:
        """How many ranks :meth:`start` will start (the hostfile is read for its length)."""
        if self.hostfile:
            from mlx_jupyter.hostfile import read_hostfile

            return len(read_hostfile(self.hostfile).hosts) * self.n
        return len(self.hosts) * self.n

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
        cfg.LocalControllerLauncher.controller_cmd = [sys.executable, "-m", "mlx_jupyter.cluster.ipcontroller"]
        cfg.LocalControllerLauncher.stop_seconds_until_kill = 2
        return cfg

    def start(self, progress: Optional[ProgressCallback] = None, timeout: Optional[float] = None) -> "Cluster":
        """Start controller and ranks; return once every rank's engine is connected with id = rank."""
        if self.owner is not None:
            raise ClusterError(f"{self.cluster_id} was started by {self.owner_text()}: it is already running")
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
        preload_serializer()
        try:
            self.ipp.start_controller_sync()
            self._controller_pids = process_tree(self.ipp.controller.pid)
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
        return requests_outstanding(self.client, ranks, ignore=self._stray_probes)

    def _publish(self) -> None:
        """List this cluster for the lab panel (a file in Jupyter's runtime dir); never fails start."""
        from mlx_jupyter.cluster import registry

        registry.publish_quietly(self)

    def _unpublish(self) -> None:
        from mlx_jupyter.cluster import registry

        registry.unpublish_quietly(self.cluster_id)

    def _start_engines(self) -> None:
        assert self.ipp is not None
        self.dead.clear()
        self.busy.clear()
        self._engine_set_id = self.ipp.start_engines_sync(rank_exit_callbacks=[self._on_rank_exit])
        self.size = self.engine_set.n
        self._controller_pids = sorted(set(self._controller_pids) | set(process_tree(self.ipp.controller.pid)))

    @property
    def engine_set(self) -> MLXEngineSetLauncher:
        assert self.ipp is not None and self._engine_set_id is not None
        return self.ipp.engines[self._engine_set_id]

    def _unregister(self, ranks: Iterable[int]) -> None:
        """Tell the hub these engines are gone, so that their ids are free at once."""
        unregister(self.client, ranks)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every rank, the controller and the client; leave no process behind.

        A connected cluster (:meth:`connect`) is only disconnected: its owner keeps it running."""
        self._stopping = True
        if self._rank_watch is not None:
            self._rank_watch.stop()
            self._rank_watch = None
        if self.owner is None:
            self._unpublish()
        for run in list(self._runs):
            run.interrupt("the cluster is stopping" if self.owner is None else "disconnected from the cluster")
        pids = set(self._controller_pids)
        if self.ipp is not None and self.ipp.controller is not None:
            pids.update(process_tree(self.ipp.controller.pid))
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
        reap(pids, timeout)
        self.size = 0
        self.ready_ns = False
        self.setup_info = {}
        self.dead.clear()
        self.busy.clear()

    def _await_controller(self, timeout: float = 30.0) -> None:
        """Until the controller's connection files are written (ipyparallel polls only every 0.1 s)."""
        from mlx_jupyter.cluster.shared.connection_files import await_json_file

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
        watch_queues(client_streams(c), self._kicked)

    def _kicked(self, stream: Any) -> None:
        self.queue_kicks += 1

    def restart(self, progress: Optional[ProgressCallback] = None, timeout: Optional[float] = None) -> "Cluster":
        """Fresh processes for every rank, same ranks, same engine ids; the controller stays."""
        if self.owner is not None:
            raise ClusterError(f"{self.cluster_id} belongs to {self.owner_text()}: restart it there "
                               "(the MLX Cluster panel, or that kernel's %mlx_cluster restart)")
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
        reap(pids, 5.0)
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

    def rank_infos(self) -> list[Any]:
        """Each rank's launch record (rank, host, pid, state): ours, or the owner's when connected."""
        if self.owner is not None:
            from mlx_jupyter.cluster.attach import rank_infos

            return rank_infos(self.owner)
        return list(self.engine_set.launcher.ranks) if self.ipp and self._engine_set_id else []

    def _rank_pids(self, es: MLXEngineSetLauncher) -> set[int]:
        return rank_pids(es)

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
