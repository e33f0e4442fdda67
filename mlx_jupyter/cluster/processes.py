"""The processes of a cluster of one's own: ipyparallel's controller, the ``mlx`` engine set (one
engine per rank) and the cell channel's server; start, restart, and a stop that leaves none behind."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol

import ipyparallel as ipp

from mlx_jupyter.cluster import registry
from mlx_jupyter.cluster.cells.cell_server import CellServer
from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.engineset import MLXEngineSetLauncher
from mlx_jupyter.cluster.rank_table import RankTable
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.shared.ipp_compat import check_ipyparallel, preload_serializer
from mlx_jupyter.cluster.startup import ProgressCallback, StartupSequence
from mlx_jupyter.cluster.supervision import Supervisor
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.vocab.rankinfo import RankInfo
from mlx_jupyter.vocab.hosts import is_local

#: controller options for fast admission: schedulers in threads (one process,
#: quick start); a heart monitor that pings every 50 ms while ranks are being admitted (an
#: engine is admitted at its first answer) and every 2 s otherwise (cluster/heartbeat.py: quick
#: beats kept up filled the logs with late answers under load); tolerant failure detection
#: (6 s of silence; rank deaths come from our launcher); no task DB.
FAST_CONTROLLER_ARGS = [
    "--usethreads",
    "--nodb",
    "--HeartMonitor.period=2000",
    "--HeartMonitor.max_heartmonitor_misses=3",
]


class ClusterSpec(Protocol):
    """What the processes are made from (:class:`~mlx_jupyter.cluster.cluster.Cluster` is one)."""

    cluster_id: str
    hosts: list[str]
    hostfile: Optional[str]
    hostfile_hosts: Optional[list[Any]]  # the hostfile's hosts, read once by the Cluster
    n: int  # ranks per host
    backend: str
    env: Mapping[str, str]
    python: str
    cwd: Optional[str]
    starting_port: int
    bind_to: str  # vocab.binding policy for ranks on this machine
    controller_ip: Optional[str]
    local: bool  # every rank runs on this machine
    log_level: int
    ssh_options: Any
    cell_channel: bool
    allocation: Any  # a ClusterAllocation (scheduler="slurm"), else None


def ipp_log(cluster_id: str, level: int) -> logging.Logger:
    """ipyparallel's log for one cluster: its own logger at ``level``, passed on to the application's.

    Left to choose, ipyparallel takes a Jupyter server's own log, whose logger passes everything
    (its handlers filter), and at that level its launcher copies the controller's whole log
    (every request, every heartbeat) into the server's log."""
    log = logging.getLogger(f"ipyparallel.cluster.cluster.{cluster_id}")
    log.setLevel(level)
    return log


def process_tree(pid: Optional[int]) -> list[int]:

    """``pid`` and all its descendants (just ``pid`` when psutil cannot tell)."""
    if not pid or pid < 0:
        return []
    try:
        import psutil

        proc = psutil.Process(pid)
        return [pid] + [c.pid for c in proc.children(recursive=True)]
    except Exception:
        return [pid]


def rank_pids(engine_set: Any) -> set[int]:
    """The processes of an engine set's ranks on this machine, with their children."""
    pids: set[int] = set()
    if engine_set.launcher is None:
        return pids
    for info in engine_set.launcher.ranks:
        if info.pid and is_local(info.host) and not info.done:   # a reaped rank's pid may be anyone's now
            pids.update(process_tree(info.pid))
    return pids


def identify(pids: Iterable[int]) -> dict[int, Any]:
    """psutil's handle on each of ``pids`` running now: it keeps the process's start and refuses to
    signal the pid once reused by another process (none without psutil, which ipyparallel brings)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return {}
    out: dict[int, Any] = {}
    for pid in set(pids):
        try:
            out[pid] = psutil.Process(pid)
        except psutil.Error:
            pass
    return out


def reap(procs: Iterable[Any], timeout: float) -> None:
    """Make sure these processes (psutil handles, taken while they were ours: :func:`identify`) are
    gone: SIGTERM what is left, then SIGKILL; a pid reused since is not touched."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return
    alive = []
    for p in set(procs):
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:   # is_running: same pid and start
                alive.append(p)
        except psutil.Error:
            pass
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


class ClusterProcesses:
    """Starts and stops the processes of ``spec``; ``table`` learns the ranks and their deaths,
    ``link`` gets the client, ``startup`` waits for the ranks, ``supervisor`` ends the runs a death
    or a stop concerns, and ``started()`` is called once the ranks are ready (with new pids)."""

    def __init__(self, spec: ClusterSpec, table: RankTable, link: ControllerLink, startup: StartupSequence,
                 supervisor: Supervisor, started: Callable[[], None] = lambda: None) -> None:
        self.spec, self.table, self.link, self.startup, self.supervisor = spec, table, link, startup, supervisor
        self.started = started
        self.ipp: Any = None  # ipyparallel's Cluster while running
        self.cell_server: Optional[CellServer] = None
        self.stopping = False
        self._engine_set_id: Optional[str] = None
        #: the controller's processes, identified while they were ours (:func:`identify`)
        self._controller_procs: dict[int, Any] = {}
        self.guard: Any = None  # the controller's ControllerGuard while it runs
        self.controller_ip: Optional[str] = spec.controller_ip

    def engine_config(self) -> Any:
        """The traitlets config of ipyparallel's Cluster: our engine set with ``spec``, our controller."""
        from traitlets.config import Config

        spec = self.spec
        cfg = Config()
        es = cfg.MLXEngineSetLauncher
        if spec.hostfile:
            es.hostfile = spec.hostfile
            es.hostfile_hosts = spec.hostfile_hosts
        es.hosts = spec.hosts
        es.repeat_hosts = spec.n
        es.backend = spec.backend
        es.python = spec.python
        es.environment = dict(spec.env)
        if self.cell_server is not None:
            es.environment.update(rank_env.variables(cell_port=self.cell_server.port))
        es.starting_port = spec.starting_port
        es.bind_to = spec.bind_to
        if spec.allocation is not None:
            es.slurm = spec.allocation.step_options()
        if spec.cwd:
            es.rank_cwd = spec.cwd
        if spec.ssh_options is not None:
            es.ssh_options = spec.ssh_options
        # an engine gives up on a silent controller after 11 checks of (period + 0.5 s): 27.5 s
        es.engine_args = ["--IPEngine.wait_for_url_file=30", "--IPEngine.timeout=30",
                          "--IPEngine.max_heartbeat_misses=11"]
        cfg.LocalControllerLauncher.controller_cmd = [sys.executable, "-m", "mlx_jupyter.cluster.ipcontroller"]
        cfg.LocalControllerLauncher.stop_seconds_until_kill = 2
        return cfg

    def start(self, progress: Optional[ProgressCallback], timeout: float) -> None:
        """Start controller and ranks; return once every rank's engine is connected with id = rank."""
        if self.ipp is not None:
            raise ClusterError("this cluster is already running; stop() or restart() it")
        check_ipyparallel()
        spec = self.spec
        self.stopping = False
        self.controller_ip = spec.controller_ip
        if spec.allocation is not None:   # the nodes first: the controller listens where they reach it
            spec.allocation.ensure()
            if self.controller_ip in (None, "", "*", "0.0.0.0"):
                self.controller_ip = spec.allocation.controller_ip()
        if spec.cell_channel and self.cell_server is None:
            self.cell_server = CellServer(self._server_ip())
        self.ipp = ipp.Cluster(
            cluster_id=spec.cluster_id,
            profile_dir=registry.profile_dir(),
            engine_launcher_class=MLXEngineSetLauncher,
            controller_args=list(FAST_CONTROLLER_ARGS),
            controller_ip=self.controller_ip or "",
            send_engines_connection_env=not spec.local,
            log_level=spec.log_level,
            log=ipp_log(spec.cluster_id, spec.log_level),
            config=self.engine_config(),
            shutdown_atexit=True,
        )
        preload_serializer()
        try:
            self.ipp.start_controller_sync()
            self._controller_procs = identify(process_tree(self.ipp.controller.pid))
            from mlx_jupyter.cluster.controller_guard import ControllerGuard

            self.guard = ControllerGuard(self.ipp.controller)
            self.link.controller_gone = self.guard.gone
            self.ipp.controller.on_stop(self._controller_stopped)
            if spec.local:  # engines start now and pick up the connection file when it appears
                self.start_engines()
                self.connect_client()
            else:  # remote engines get the connection info in their environment
                self.connect_client()
                self.start_engines()
            self.startup.run(progress, timeout)
            self.guard.record_members()
        except BaseException:
            self.stop()
            raise
        self.started()

    def _controller_stopped(self, data: Any) -> None:
        """The controller ended without a stop: the ranks cannot be reached, so a Slurm job is released."""
        if self.guard is not None and not self.stopping:
            self.guard.stopped(data)
        alloc = self.spec.allocation
        if self.stopping or alloc is None or alloc.job_id is None:
            return
        print(f"mlx-jupyter: the controller ended unexpectedly ({data}); releasing Slurm job {alloc.job_id} "
              "(%mlx_cluster stop, then start, for new ranks)", file=sys.stderr)
        import threading

        threading.Thread(target=alloc.release, name="mlx-slurm-release", daemon=True).start()

    def _server_ip(self) -> str:
        """Where the cell channel listens: beside the controller (all interfaces for remote ranks)."""
        if self.spec.local:
            return "127.0.0.1"
        ip = self.controller_ip
        return ip if ip not in (None, "", "*", "0.0.0.0") else "*"

    def await_controller(self, timeout: float = 30.0) -> None:
        """Until the controller's connection files are written (ipyparallel polls only every 0.1 s)."""
        from mlx_jupyter.cluster.shared.connection_files import await_json_file

        controller = self.ipp.controller
        end = time.monotonic() + timeout
        for path in getattr(controller, "connection_files", {}).values():
            while not await_json_file(path, 0.05):
                if controller.poll() is not None or time.monotonic() > end:
                    return  # ipyparallel's own wait says what went wrong

    def connect_client(self) -> None:
        """The ipyparallel client, given to the link (which watches its streams for messages left unread)."""
        self.await_controller()
        c = self.ipp.connect_client_sync()
        if isinstance(c, ipp.Client):  # its streams exist only once it is connected
            check_ipyparallel(c)
            if self.cell_server is not None:
                self.cell_server.start(c.session)
        self.link.attach(c)

    def start_engines(self) -> None:
        """Launch the engine set (the ranks); the table learns their number."""
        self.table.reset(0)  # before the launch: a rank may die while it starts
        self._engine_set_id = self.ipp.start_engines_sync(rank_exit_callbacks=[self.rank_exited])
        self.table.size = self.engine_set.n
        if self.guard is None or not self.guard.gone():   # alive: its pid and tree are still its own
            found = identify(process_tree(self.ipp.controller.pid))
            self._controller_procs = {**found, **self._controller_procs}

    @property
    def engine_set(self) -> MLXEngineSetLauncher:
        assert self.ipp is not None and self._engine_set_id is not None
        engine_set: MLXEngineSetLauncher = self.ipp.engines[self._engine_set_id]
        return engine_set

    def has_engine_set(self) -> bool:
        """Whether the ranks' engine set exists (not after a restart whose new ranks failed to start)."""
        return self.ipp is not None and self._engine_set_id is not None and self._engine_set_id in self.ipp.engines

    def rank_infos(self) -> list[RankInfo]:
        """Each rank's launch record (rank, host, pid, state)."""
        return list(self.engine_set.launcher.ranks) if self.has_engine_set() and self.engine_set.launcher else []

    def rank_exited(self, rank: int, returncode: Optional[int]) -> None:
        """A rank's process ended (launcher thread): the runs waiting on it end, the cell server and the
        controller forget it, then the exit callbacks hear of it."""
        if self.stopping:
            return
        self.table.died(rank, returncode)
        if self.cell_server is not None:
            self.cell_server.forget([rank])
        self.link.unregister([rank])
        self.supervisor.rank_died(rank, returncode)
        self.table.announce_exit(rank, returncode)
        alloc = self.spec.allocation
        if alloc is not None and alloc.on_failure == "release" and alloc.job_id is not None:
            import threading

            threading.Thread(target=alloc.release, name="mlx-slurm-release", daemon=True).start()

    def pids(self) -> set[int]:
        """Every process of this cluster on this machine: the controller's tree and the ranks'."""
        return set(self.procs())

    def procs(self) -> dict[int, Any]:
        """:meth:`pids`, each with psutil's handle taken while it was ours (a reused pid is not included)."""
        procs = dict(self._controller_procs)
        if self.ipp is not None and self.ipp.controller is not None and (self.guard is None or not self.guard.gone()):
            for pid, proc in identify(process_tree(self.ipp.controller.pid)).items():
                procs.setdefault(pid, proc)
        try:
            for es in list(self.ipp.engines.values()) if self.ipp else []:
                if es.launcher is not None:
                    for pid, proc in identify(rank_pids(es)).items():
                        procs.setdefault(pid, proc)
        except Exception:
            pass
        return procs

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every rank, the controller and the client; leave no process behind."""
        self.stopping = True
        self.supervisor.interrupt_runs("the cluster is stopping")
        procs = list(self.procs().values())
        self.link.close()
        if self.cell_server is not None:
            self.cell_server.close()
            self.cell_server = None
        if self.ipp is not None:
            try:
                self.ipp.stop_cluster_sync()
            except Exception:
                pass
            self.ipp = None
        reap(procs, timeout)
        if self.guard is not None:   # the controller's orphaned child too, if it was killed
            self.guard.end()
            self.guard = None
        self.link.controller_gone = lambda: ""
        self.table.reset(0)

    def restart(self, progress: Optional[ProgressCallback], timeout: float) -> None:
        """Fresh processes for every rank, same ranks, same engine ids; the controller stays (a dead
        one is replaced: the whole cluster starts again)."""
        if self.guard is not None and self.guard.gone():
            self.stop()
            self.start(progress, timeout)
            return
        self.stopping = True
        self.supervisor.interrupt_runs("the cluster is restarting")
        procs = identify(rank_pids(self.engine_set)) if self.has_engine_set() else {}   # none: the last restart failed
        if self.cell_server is not None:
            self.cell_server.forget()
        self.ipp.stop_engines_sync()
        reap(procs.values(), 5.0)
        self.link.unregister(range(self.table.size))
        deadline = time.monotonic() + 5.0
        while self.link.ids() and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.link.ids():
            raise ClusterError(f"the controller still lists engines {self.link.ids()} after stopping them")
        self.stopping = False
        try:
            if self.spec.allocation is not None:   # a kept allocation is reused; a released one asked for again
                self.spec.allocation.ensure()
                self.ipp.config.MLXEngineSetLauncher.slurm = self.spec.allocation.step_options()
            self.start_engines()
            self.startup.run(progress, timeout)
        except BaseException as exc:   # the old ranks are gone: say so at every later request, not ipyparallel
            how = "interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped by an error"
            self.table.not_running = f"the last restart was {how} before the new ranks connected"
            raise
        self.started()
