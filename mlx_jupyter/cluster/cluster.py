"""The notebook's handle on MLX ranks as ipyparallel engines: :class:`Cluster`.

A Cluster (an ipyparallel controller set up for fast admission, the ``mlx`` engine set of
:mod:`mlx_jupyter.cluster.engineset`, the direct cell channel's hub) is composed of parts, each
given what it uses when it is made, and each usable and testable alone:

- :class:`~mlx_jupyter.cluster.processes.ClusterProcesses`: start, restart and stop of the processes;
- :class:`~mlx_jupyter.cluster.rank_table.RankTable`: the ranks, the dead and the busy;
- :class:`~mlx_jupyter.cluster.controller_link.ControllerLink`: the ipyparallel client;
- :class:`~mlx_jupyter.cluster.startup.StartupSequence`: waiting for the ranks of a (re)start;
- :class:`~mlx_jupyter.cluster.rank_control.RankControl`: abort and status on the control channel;
- :class:`~mlx_jupyter.cluster.supervision.Supervisor`: waits that end on a death or the stop button;
- :class:`~mlx_jupyter.cluster.data.DataMover`: push, pull, scatter, gather;
- :class:`~mlx_jupyter.cluster.namespaces.RankNamespaces`: ``mx``, ``world`` and ``group`` on the ranks.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from mlx_jupyter.cluster.busy_listing import BusyListing
from mlx_jupyter.cluster.cells.hub import CellHub
from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.data import DataMover
from mlx_jupyter.cluster.engineset import MLXEngineSetLauncher
from mlx_jupyter.cluster.namespaces import RankNamespaces
from mlx_jupyter.cluster.processes import FAST_CONTROLLER_ARGS, ClusterProcesses
from mlx_jupyter.cluster.profiling import RankProfiler
from mlx_jupyter.launch.binding import check_policy
from mlx_jupyter.cluster.rank_control import RankControl
from mlx_jupyter.cluster.rank_table import RankTable
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.shared.ipp_compat import IPP_FIX, check_ipyparallel, ipyparallel_problems
from mlx_jupyter.cluster.startup import ProgressCallback, StartupSequence
from mlx_jupyter.cluster.supervision import Supervisor
from mlx_jupyter.hostfile import default_ranks_per_host
from mlx_jupyter.launch import rank_env
from mlx_jupyter.net.hosts import LOCAL_HOSTS, all_local
from mlx_jupyter.options import option

__all__ = ["Cluster", "ClusterError", "MLXEngineSetLauncher", "IPP_FIX", "check_ipyparallel",
           "ipyparallel_problems", "FAST_CONTROLLER_ARGS", "LOCAL_HOSTS"]

log = logging.getLogger(__name__)
#: a restart after the controller died: what it does (nothing could be saved through the dead controller)
NEW_CONTROLLER = "a new controller and new ranks, started empty: variables cannot be saved without the controller"
#: the same, when the cell channel reaches the live ranks: their names are saved over it
NEW_CONTROLLER_KEPT = "a new controller and new ranks; the live ranks keep their variables (saved over the cell channel)"


def _read(hostfile: Optional[str], backend: Optional[str], env: Optional[Mapping[str, str]]) -> Any:
    """The hostfile, read once for the whole start (now, so that a bad one fails here), and the
    backend and env from it under the explicit ones."""
    from mlx_jupyter.hostfile import merge_settings, read_hostfile

    hf = read_hostfile(hostfile) if hostfile else None
    return hf, merge_settings(hf, f"hostfile {hostfile}", backend, env)


class Cluster:
    """MLX ranks as ipyparallel engines, engine id = rank. A context manager.

    ``n`` ranks per host (like ``mlx.launch -n``; default 1 per host named, 2 when
    none is: :func:`~mlx_jupyter.hostfile.default_ranks_per_host`); ``hosts`` a list or
    ``"h1,h2"`` (default this machine), or ``hostfile`` (read once, here). ``env`` is added
    to every rank's environment. A hostfile's ``backend`` and ``envs`` apply unless
    ``backend``/``env`` say otherwise (a notice names each override); else
    :func:`~mlx_jupyter.launch.backends.default_backend`. Every option a command line also has is
    :mod:`mlx_jupyter.options`'s (tests/test_options.py checks this signature against it). ``ssh_options`` (:class:`mlx_jupyter.net.ssh.SSHOptions`)
    say how to reach remote hosts. With remote hosts the controller listens on
    every interface and tells the engines this machine's name; pass
    ``controller_ip`` (an address of this machine the hosts can reach) when
    that name does not resolve to such an address on the hosts.
    ``cell_channel``: send cells straight to the ranks, beside the controller
    (:mod:`mlx_jupyter.cluster.cells.hub`); default on unless ``MLX_JUPYTER_CELL_CHANNEL=0``.
    ``scheduler="slurm"``: the ranks run as one srun step on ``nodes`` nodes (``n`` per node) of a
    Slurm job held for the cluster (``partition``, ``time``, ``account``, ``slurm_args``: sbatch's;
    ``slurm``: a whole :class:`~mlx_jupyter.launch.slurm.SlurmOptions`), the controller here;
    ``on_failure``: after a rank died, ``"release"`` the job or ``"keep"`` it for :meth:`restart`.
    ``bind_to``: ``"cores"`` runs each rank on this machine on its own share of its CPUs (when
    there are enough; :mod:`mlx_jupyter.launch.binding`), ``"none"`` leaves placement to the OS.
    ``record_state``: after each cell that ends cleanly, each rank records its names in the background
    on its own host, so that a rank that dies comes back at :meth:`restart` with its state as of its
    last finished cell (:mod:`.state_records`; :meth:`record` switches it later).
    """

    def __init__(
        self,
        n: Optional[int] = None,
        hosts: Optional[Sequence[str] | str] = None,
        hostfile: Optional[str] = None,
        backend: Optional[str] = None,
        python: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        starting_port: int = 0,
        controller_ip: Optional[str] = None,
        timeout: float = option("timeout").default,
        log_level: int = logging.WARNING,
        ssh_options: Optional[Any] = None,
        cell_channel: Optional[bool] = None,
        scheduler: Optional[str] = None,
        nodes: Optional[int] = None,
        partition: Optional[str] = None,
        time: Optional[str] = None,
        account: Optional[str] = None,
        slurm_args: Sequence[str] = (),
        on_failure: str = "release",
        slurm: Optional[Any] = None,
        bind_to: str = option("bind_to").default,
        record_state: bool = False,
    ):
        if hosts and hostfile:
            raise ValueError("give hosts or hostfile, not both (the hostfile lists the hosts)")
        from mlx_jupyter import limits
        from mlx_jupyter.cluster.slurm_allocation import for_cluster

        timeout = limits.seconds("timeout=", timeout)   # nan, inf or <= 0 refused as the magics and CLIs refuse them

        self.allocation = for_cluster(scheduler, slurm, bool(hosts or hostfile), n=n, nodes=nodes,
                                      partition=partition, time=time, account=account, args=slurm_args,
                                      on_failure=on_failure)
        if isinstance(hosts, str):
            hosts = [h.strip() for h in hosts.split(",")]
        self.hosts = list(hosts or ["127.0.0.1"])
        if any(not h for h in self.hosts):
            raise ValueError("empty host name in hosts")
        self.hostfile = hostfile
        self.n = default_ranks_per_host(bool(hosts or hostfile)) if n is None else int(n)
        if self.allocation is not None:
            self.n = self.allocation.opts.ranks_per_node
        if self.n < 1:
            raise ValueError(f"n must be at least 1 rank per host, got {n}")
        self.python = python or sys.executable
        read, settings = _read(hostfile, backend, env)
        #: the hostfile's hosts, as read here: the engine set and the launcher do not read it again
        self.hostfile_hosts: Optional[list[Any]] = list(read.hosts) if read is not None else None
        self.backend, self.env, self.notices = settings.backend, settings.env, settings.notices
        for notice in self.notices:
            print(f"mlx-jupyter: {notice}", file=sys.stderr)
        self.cwd = cwd
        self.starting_port = starting_port
        self.bind_to = check_policy(bind_to, "bind_to")
        self.local = self.allocation is None and all_local(
            [h.ssh for h in self.hostfile_hosts] if self.hostfile_hosts is not None else self.hosts)
        self.controller_ip = controller_ip or (None if self.local else "*")
        self.timeout = timeout
        self.log_level = log_level
        self.ssh_options = ssh_options
        self.cluster_id = f"mlx-{secrets.token_hex(4)}"
        if cell_channel is None:
            cell_channel = os.environ.get(rank_env.CELL_CHANNEL, "1") != "0"  # "0": through the controller
        self.cell_channel = cell_channel
        from mlx_jupyter.cluster.state_records import StateRecords

        #: the opt-in per-cell record of each rank's own names (a dead rank's, restored at restart)
        self.records = StateRecords(self.cluster_id, bool(record_state))
        self.owner: Optional[dict[str, Any]] = None  # set by connect(): the process that owns the ranks
        self.publish_as = "kernel"  # who owns it, as the lab panel's registry says ("server" for the panel's)
        #: how the user restarts the ranks from where our messages are shown (the magics set theirs)
        self.restart_command = "cluster.restart()"
        #: what a failed restart's message says to do next (None: from ``restart_command``)
        self.failed_restart_advice: Optional[str] = None
        self.ready_time: Optional[float] = None
        self.last_restart: Optional[str] = None  # the last restart's one-line report
        self._rank_watch: Any = None  # a connected cluster's watch on the owner's ranks (attach.RankWatch)
        # the parts, each given what it uses
        self.table = RankTable(output=lambda: self.engine_set.rank_output)
        self.link = ControllerLink()
        self.link.gone_advice = lambda: (f"restart the cluster: {self.restart_command} "
                                         f"({NEW_CONTROLLER_KEPT if self.hub is not None else NEW_CONTROLLER})")
        self.startup = StartupSequence(self.link, self.table, self.backend, hub=lambda: self.hub)
        self.control = RankControl(self.link, self.table, self.startup, self.backend, self.rank_infos)
        self.supervisor = Supervisor(self.link, self.table, self.control, lambda: self.restart_advice)
        self.busy_listing = BusyListing(lambda busy: self._publish(busy=busy) if self.running else None)
        # the file lists the dead too: the panel's only word on ranks on other hosts (registry.rank_health)
        self.table.exit_callbacks.append(lambda rank, returncode: self.busy_listing.republish())
        self.processes = ClusterProcesses(self, self.table, self.link, self.startup, self.supervisor,
                                          started=self._publish)
        self.data = DataMover(self.link, self.table, self.supervisor)
        self.namespaces = RankNamespaces(self.link, self.table, self.supervisor, self.control, self.backend,
                                         restart_advice=lambda: self.restart_advice)
        self.profiler = RankProfiler(self.link, self.table, self.supervisor)

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

    @property
    def restart_advice(self) -> str:
        """How to get fresh ranks, as it works from where the message is shown."""
        if self.owner is not None:
            from mlx_jupyter.cluster.attach import stopped_advice

            return stopped_advice(self) or (f"{self.owner_restart_advice()} "
                                            f"(this notebook is only connected to {self.cluster_id})")
        return f"restart the ranks: {self.restart_command} (the live ranks keep their variables)"

    def expected_size(self) -> int:
        """How many ranks :meth:`start` will start."""
        if self.allocation is not None:
            return (self.allocation.opts.nodes or 1) * self.n
        return len(self.hostfile_hosts if self.hostfile_hosts is not None else self.hosts) * self.n

    # ------------------------------------------------------------ the processes

    def start(self, progress: Optional[ProgressCallback] = None, timeout: Optional[float] = None) -> "Cluster":
        """Start controller and ranks; return once every rank's engine is connected with id = rank."""
        if self.owner is not None:
            raise ClusterError(f"{self.cluster_id} was started by {self.owner_text()}: it is already running")
        t0 = time.perf_counter()
        try:
            self.processes.start(progress, self.timeout if timeout is None else timeout)
        except BaseException:
            if self.allocation is not None:   # a failed start holds no nodes
                self.allocation.release()
            raise
        self.ready_time = time.perf_counter() - t0
        from mlx_jupyter.cluster.rank.keep_files import sweep_stale

        sweep_stale()   # what a restart whose kernel was killed left here (a listing of one folder)
        if self.records.on:
            self.records.switch(self)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every rank, the controller and the client; leave no process behind.

        A connected cluster (:meth:`connect`) is only disconnected: its owner keeps it running."""
        if self.owner is None:
            self.busy_listing.close()
            self._unpublish()
            self.processes.stop(timeout)
            self.records.cleanup(self)
            if self.allocation is not None:
                self.allocation.release()
        else:
            if self._rank_watch is not None:
                self._rank_watch.stop()
                self._rank_watch = None
            self.supervisor.interrupt_runs("disconnected from the cluster")
            self.link.close()
            self.table.reset(0)
        self.namespaces.forget()

    def restart(self, progress: Optional[ProgressCallback] = None, timeout: Optional[float] = None,
                clean: bool = False, quiet: bool = False) -> "Cluster":
        """Fresh processes for every rank (a new MLX ``world``, a new ``group``), same ranks, same
        engine ids; the controller stays. By default each rank's user names are kept (saved on its
        own host, restored into the new rank of the same number: :mod:`.kept_state`) and one line
        says what was kept and what was not (cells still running are stopped first); ``clean=True``
        starts the ranks empty."""
        if self.owner is not None:
            from mlx_jupyter.cluster.attach import stopped_advice

            raise ClusterError(stopped_advice(self) or
                               f"{self.cluster_id} belongs to {self.owner_text()}: {self.owner_restart_advice()}")
        if self.processes.ipp is None or self.link.client is None:
            return self.start(progress, timeout)
        wait = self.timeout if timeout is None else timeout

        def fresh_ranks() -> None:
            self.namespaces.forget()
            self.last_error_rank = None   # the tracebacks went with the old ranks
            self.processes.restart(progress, wait)

        self.last_restart = None
        self.restart_origins: dict[int, str] = {}   # rank -> where its names came from (peer_restore)
        gone = self.link.controller_gone()
        from mlx_jupyter.cluster import channel_calls

        live = [r for r in self.table.ranks if r not in self.table.dead]
        if clean or (gone and not channel_calls.usable(self.hub, live)):   # nothing to save the names through
            fresh_ranks()
            self.last_restart = f"restart: {self.size} ranks started empty ({'--clean' if clean else NEW_CONTROLLER})"
            if self.records.on:
                self.records.switch(self)
            return self
        from mlx_jupyter.cluster.kept_state import restart_keeping

        self.last_restart = restart_keeping(self, fresh_ranks)
        if gone:   # saved over the cell channel, restored through the new controller's cluster
            self.last_restart += "; a new controller replaced the dead one"
        if self.records.on:   # the new ranks record on (a dead rank's new process from its old record)
            self.records.switch(self)
        if not quiet:
            self.namespaces.out(self.last_restart)
        return self

    def record(self, on: bool = True) -> dict[int, Any]:
        """Switch the per-cell record of each rank's own names on or off (``record_state``); rank -> its state."""
        return self.records.switch(self, on)

    def owner_restart_advice(self) -> str:
        """How a notebook connected to this cluster gets fresh ranks: only where the owner is."""
        if (self.owner or {}).get("owner") == "server":
            return "restart it with the Restart button of the MLX Cluster panel (it keeps the ranks' names)"
        return "restart it in that kernel's notebook with %mlx_cluster restart (it keeps the ranks' names)"

    def death_note(self, rank: int) -> str:
        """Why Slurm ended ``rank`` (time limit, node failure), in a few words; empty when it did not."""
        return self.allocation.rank_note(self, rank) if self.allocation is not None else ""

    def _publish(self, busy: Sequence[int] = ()) -> None:
        """List this cluster for the lab panel (a file in Jupyter's runtime dir); never fails start.
        ``busy``: the ranks running a cell (the panel shows them running, the others idle)."""
        from mlx_jupyter.cluster import registry

        if self.owner is None:  # a connected notebook's view is not the owner's to publish
            registry.publish_quietly(self, busy)

    def _unpublish(self) -> None:
        from mlx_jupyter.cluster import registry

        registry.unpublish_quietly(self.cluster_id)

    @property
    def ipp(self) -> Any:
        """ipyparallel's Cluster (controller and engine set) while running."""
        return self.processes.ipp

    @property
    def hub(self) -> Optional[CellHub]:
        """The direct cell channel's hub (None without one, or while stopped)."""
        return self.processes.hub

    @property
    def engine_set(self) -> MLXEngineSetLauncher:
        return self.processes.engine_set

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def rank_infos(self) -> list[Any]:
        """Each rank's launch record (rank, host, pid, state): ours, or the owner's when connected."""
        if self.owner is not None:
            from mlx_jupyter.cluster.attach import rank_infos

            return rank_infos(self.owner)
        return self.processes.rank_infos()

    # ------------------------------------------------------------ state, as the parts hold it

    @property
    def running(self) -> bool:
        return self.link.client is not None

    @property
    def client(self) -> Any:
        """The ipyparallel client (None while stopped)."""
        return self.link.client

    @property
    def size(self) -> int:
        return self.table.size

    @property
    def ranks(self) -> list[int]:
        return self.table.ranks

    @property
    def dead(self) -> dict[int, Optional[int]]:
        return self.table.dead

    @property
    def busy(self) -> dict[int, Any]:
        return self.table.busy

    @property
    def rank_exit_callbacks(self) -> list[Callable[[int, Optional[int]], None]]:
        return self.table.exit_callbacks

    @property
    def needs_reform(self) -> bool:
        """Whether an abort or a failed cell happened since the ranks were last looked at: the next
        cell (with ``init``) first asks them what it left, and forms again only what was aborted."""
        return self.table.unsettled

    @property
    def ready_ns(self) -> bool:
        return self.namespaces.ready

    @property
    def setup_info(self) -> dict[int, dict]:
        return self.namespaces.info

    @property
    def view(self) -> Any:
        """A blocking DirectView over every rank, in rank order."""
        view = self.link.view(self.ranks)
        view.block = True
        return view

    # ------------------------------------------------------------ what the parts do

    def setup(self, world: bool = True, group: bool = True, timeout: float = 60.0) -> dict[int, dict]:
        """Define ``mx``, ``world`` and ``group`` on every rank; see :class:`RankNamespaces`."""
        return self.namespaces.setup(world, group, timeout)

    def reform(self, timeout: float = 10.0, attempts: int = 2) -> dict[int, dict]:
        """Form our core's ``group`` afresh on every rank; see :class:`RankNamespaces`."""
        return self.namespaces.reform(timeout, attempts)

    def push(self, ns: Mapping[str, Any], targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> None:
        """Define the names of ``ns`` in every target rank's namespace."""
        self.data.push(ns, targets, timeout)

    def pull(self, names: str | Sequence[str], targets: Optional[Sequence[int]] = None,
             timeout: float = 60.0) -> list[Any]:
        """The value(s) of ``names`` on each target rank, in rank order."""
        return self.data.pull(names, targets, timeout)

    def scatter(self, name: str, seq: Any, targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> None:
        """Split ``seq`` into consecutive parts, part r bound to ``name`` on rank r."""
        self.data.scatter(name, seq, targets, timeout)

    def gather(self, name: str, targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> Any:
        """Concatenate ``name`` from every rank, in rank order."""
        return self.data.gather(name, targets, timeout)

    def abort(self, reason: str = "aborted by the user", targets: Optional[Sequence[int]] = None,
              timeout: float = 2.0) -> dict[int, bool]:
        """Abort whatever runs on ``targets``; rank -> whether a cell was running there."""
        return self.control.abort(reason, targets, timeout)

    def status(self, timeout: float = 1.0, forming_grace: float = 2.0) -> list[dict]:
        """One row per rank; see :meth:`RankControl.status`."""
        return self.control.status(timeout, forming_grace)

    def where(self, timeout: float = 1.0) -> Any:
        """Where every rank is now (idle, or the line and the collective of its cell), as a table with a
        one-line diagnosis; works while :meth:`run` is in progress in another thread. See :meth:`RankControl.where`."""
        return self.control.where(timeout)

    def where_samples(self, ranks: Optional[Sequence[int]] = None, timeout: float = 1.0) -> dict[int, dict]:
        """Each rank's latest sample of where it is (the live table's source for cells through the controller)."""
        return self.control.where_samples(ranks, timeout)

    def forming_world(self) -> list[int]:
        """The ranks still forming MLX's world begun after start (they answer nothing meanwhile)."""
        return self.startup.forming_world()

    def check_ranks(self, ranks: Sequence[int]) -> None:
        """Raise a clear error if a rank is dead or still busy with an earlier cell (and why, if Slurm ended it)."""
        if self._rank_watch is not None and any(r in self.dead for r in ranks):
            self._rank_watch.poll()   # the owner may have just restarted them (the panel's Restart)
        try:
            self.supervisor.check_ranks(ranks)
        except ClusterError as exc:
            notes = sorted({self.death_note(r) for r in self.dead if r in ranks} - {""})
            if not notes:
                raise
            raise ClusterError("\n".join([*notes, str(exc)])) from None

    def wait(self, ar: Any, timeout: Optional[float], ranks: Sequence[int], what: str = "the request") -> Any:
        """Wait for an AsyncResult; fail at once if one of ``ranks`` dies; see :meth:`Supervisor.wait`."""
        return self.supervisor.wait(ar, timeout, ranks, what)

    def run(self, code: str, targets: Optional[Sequence[int]] = None, release_deadline: float = 2.0,
            init: bool = True, profile: bool = False) -> Any:
        """Start a supervised run of ``code`` on ``targets`` (default all); see :class:`CellRun`.

        ``init``: first define ``mx``, ``world`` and ``group`` on the ranks, or mend them after an
        abort, as :class:`~mlx_jupyter.cluster.namespaces.RankNamespaces` decides (the magics'
        ``--no-init`` turns it off). ``profile``: record every op of our core on the ranks while
        the cell runs; :meth:`profile` gives the records once it has ended.
        """
        from mlx_jupyter.cluster.cells.run import CellRun

        ranks = list(self.ranks if targets is None else targets)
        self.check_ranks(ranks)
        if init:
            self.namespaces.prepare()
        if profile:
            self.profiler.start(ranks)
        run = CellRun(self, code, ranks, release_deadline)
        if profile:
            self.profiler.attach(run)
        return run.start()

    def execute(self, code: str, targets: Optional[Sequence[int]] = None, timeout: Optional[float] = None,
                init: bool = True) -> list[Optional[str]]:
        """Run ``code`` on the ranks until it ended everywhere: each rank's result, or one error; see :mod:`.execute`."""
        from mlx_jupyter.cluster.execute import execute

        return execute(self, code, targets, timeout, init)

    def profile(self, timeout: float = 10.0) -> dict[int, list[Any]]:
        """The op records (:class:`~mlx_jupyter.collective.profile.OpRecord`) of the last profiled cell, per
        rank; gathered from the ranks once that cell has ended ({} before any)."""
        return self.profiler.collect(timeout)

    # ------------------------------------------------------------ what a cell run needs (cells.run.RunHost)

    def debug(self, rank: Optional[int] = None, commands: str = "") -> Any:
        """Start a post-mortem pdb on ``rank``'s last traceback (default: the first rank that raised
        in the last failed cell); ``commands``: ``;``-separated pdb commands run without prompting.
        Returns the :class:`CellRun` (``.display()`` shows it and answers the prompts)."""
        if rank is None:
            rank = getattr(self, "last_error_rank", None)
            if rank is None:
                raise ClusterError("no cell has raised on a rank since the ranks started: name the rank "
                                   "(%mlx_debug RANK)")
        if rank not in self.ranks:
            raise ClusterError(f"no rank {rank}: the ranks are 0-{self.size - 1}")
        code = ("__import__('mlx_jupyter.cluster.rank.debugger', fromlist=['post_mortem'])"
                f".post_mortem({commands!r})")
        return self.run(code, [rank], init=False)

    def cell_hub(self, ranks: Optional[Sequence[int]] = None) -> Optional[CellHub]:
        """The direct cell channel for a cell on ``ranks``, if this cluster has one (see
        :mod:`mlx_jupyter.cluster.cells.hub`) and no request through the controller is still running
        on those ranks: a cell sent beside it could overtake it."""
        if self.hub is None or self.link.client is None:
            return None
        if ranks and self.link.requests_on(ranks):
            return None
        return self.hub

    def send_execute(self, rank: int, code: str, hook: Any, cell_number: int = 0) -> str:
        """Send ``code`` to ``rank`` through the controller (``cell_number``: the notebook's, for tracebacks)."""
        return self.link.send_execute(rank, code, hook, cell_number)

    def send_abort(self, reason: str, ranks: Sequence[int],
                   msg_ids: Optional[dict[int, str]] = None) -> dict[int, Any]:
        """``mlx_abort_request`` to each rank's control channel; see :meth:`RankControl.send_abort`."""
        return self.control.send_abort(reason, ranks, msg_ids)

    def run_started(self, run: Any) -> None:
        self.supervisor.run_started(run)
        if self.owner is None:   # listed running only if it lasts (busy_listing): a short cell writes nothing
            self.busy_listing.started(run)

    def run_ended(self, run: Any) -> None:
        if run.first_error is not None:
            self.last_error_rank = run.first_error  # %mlx_debug's default
        if run.failed:  # what it left is looked at before the next cell (RankNamespaces.settle)
            self.table.unsettled = True
        self.supervisor.run_ended(run)
        self.busy_listing.ended(run)

    def mark_busy(self, rank: int, request: Any) -> None:
        """``rank`` still runs ``request`` (anything with ``done()``): no new cell goes there until it ends."""
        self.table.busy[rank] = request

