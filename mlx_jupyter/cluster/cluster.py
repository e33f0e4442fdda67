"""A cluster this process owns: :class:`Cluster`, the handle that starts, restarts and stops the ranks.

Its processes (an ipyparallel controller set up for fast admission, the ``mlx`` engine set of
:mod:`mlx_jupyter.cluster.engineset`, the direct cell channel's server) are
:class:`~mlx_jupyter.cluster.processes.ClusterProcesses`; what every handle on ranks does (cells,
data, control, supervision) is :class:`~mlx_jupyter.cluster.session.ClusterSession`'s. A cluster
of another process's is reached with :meth:`Cluster.connect`
(:class:`~mlx_jupyter.cluster.connected.ConnectedCluster`).
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import time
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from mlx_jupyter.cluster.busy_listing import BusyListing
from mlx_jupyter.cluster.cells.cell_server import CellServer
from mlx_jupyter.cluster.connected import ConnectedCluster
from mlx_jupyter.cluster.engineset import MLXEngineSetLauncher
from mlx_jupyter.cluster.processes import FAST_CONTROLLER_ARGS, ClusterProcesses
from mlx_jupyter.cluster.restart_context import KEEPS, PYTHON, RestartContext
from mlx_jupyter.cluster.session import ClusterSession
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.shared.ipp_compat import IPP_FIX, check_ipyparallel, ipyparallel_problems
from mlx_jupyter.cluster.startup import ProgressCallback
from mlx_jupyter.cluster.state_records import StateRecords
from mlx_jupyter.hostfile import Hostfile, LaunchSettings, default_ranks_per_host
from mlx_jupyter.vocab.hosts import BOTH_HOST_SOURCES
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.vocab.binding import check_policy
from mlx_jupyter.vocab.hosts import LOCAL_HOSTS, all_local
from mlx_jupyter.vocab.options import option

if TYPE_CHECKING:
    from mlx_jupyter.cluster.cells.run import CellRun
    from mlx_jupyter.cluster.slurm_allocation import ClusterAllocation
    from mlx_jupyter.hostfile import Host
    from mlx_jupyter.vocab.rankinfo import RankInfo
    from mlx_jupyter.launch.slurm import SlurmOptions
    from mlx_jupyter.net.ssh import SSHOptions

__all__ = ["Cluster", "ClusterError", "MLXEngineSetLauncher", "IPP_FIX", "check_ipyparallel",
           "ipyparallel_problems", "FAST_CONTROLLER_ARGS", "LOCAL_HOSTS"]

log = logging.getLogger(__name__)
#: a restart after the controller died: what it does (nothing could be saved through the dead controller)
NEW_CONTROLLER = "a new controller and new ranks, started empty: variables cannot be saved without the controller"
#: the same, when the cell channel reaches the live ranks: their names are saved over it
NEW_CONTROLLER_KEPT = "a new controller and new ranks; the live ranks keep their variables (saved over the cell channel)"


def _read(hostfile: Optional[str], backend: Optional[str],
          env: Optional[Mapping[str, str]]) -> tuple[Optional[Hostfile], LaunchSettings]:
    """The hostfile, read once for the whole start (now, so that a bad one fails here), and the
    backend and env from it under the explicit ones."""
    from mlx_jupyter.hostfile import merge_settings, read_hostfile

    hf = read_hostfile(hostfile) if hostfile else None
    return hf, merge_settings(hf, f"hostfile {hostfile}", backend, env, env_source="env (--env)")


class Cluster(ClusterSession):
    """MLX ranks as ipyparallel engines, engine id = rank, in processes this one owns. A context manager.

    ``n`` ranks per host (like ``mlx.launch -n``; default 1 per host named, 2 when
    none is: :func:`~mlx_jupyter.hostfile.default_ranks_per_host`); ``hosts`` a list or
    ``"h1,h2"`` (default this machine), or ``hostfile`` (read once, here). ``env`` is added
    to every rank's environment. A hostfile's ``backend`` and ``envs`` apply unless
    ``backend``/``env`` say otherwise (a notice names each override); else
    :func:`~mlx_jupyter.vocab.backends.default_backend`. Every option a command line also has is
    :mod:`mlx_jupyter.vocab.options`'s (tests/test_options.py checks this signature against it). ``ssh_options`` (:class:`mlx_jupyter.net.ssh.SSHOptions`)
    say how to reach remote hosts. With remote hosts the controller listens on
    every interface and tells the engines this machine's name; pass
    ``controller_ip`` (an address of this machine the hosts can reach) when
    that name does not resolve to such an address on the hosts.
    ``cell_channel``: send cells straight to the ranks, beside the controller
    (:mod:`mlx_jupyter.cluster.cells.cell_server`); default on unless ``MLX_JUPYTER_CELL_CHANNEL=0``.
    ``scheduler="slurm"``: the ranks run as one srun step on ``nodes`` nodes (``n`` per node) of a
    Slurm job held for the cluster (``partition``, ``time``, ``account``, ``slurm_args``: sbatch's;
    ``slurm``: a whole :class:`~mlx_jupyter.launch.slurm.SlurmOptions`), the controller here;
    ``on_failure``: after a rank died, ``"release"`` the job or ``"keep"`` it for :meth:`restart`.
    ``bind_to``: ``"cores"`` runs each rank on this machine on its own share of its CPUs (when
    there are enough; :mod:`mlx_jupyter.vocab.binding`), ``"none"`` leaves placement to the OS.
    ``record_state``: after each cell that ends cleanly, each rank records its names in the background
    on its own host, so that a rank that dies comes back at :meth:`restart` with its state as of its
    last finished cell (:mod:`.state_records`; :meth:`record` switches it later).
    ``context``: where it is driven from (:mod:`.restart_context`: plain Python, the magics, the panel),
    which says what its messages advise for fresh ranks and whose the panel's listing says it is.
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
        ssh_options: Optional[SSHOptions] = None,
        cell_channel: Optional[bool] = None,
        scheduler: Optional[str] = None,
        nodes: Optional[int] = None,
        partition: Optional[str] = None,
        time: Optional[str] = None,
        account: Optional[str] = None,
        slurm_args: Sequence[str] = (),
        on_failure: str = "release",
        slurm: Optional[SlurmOptions] = None,
        bind_to: str = option("bind_to").default,
        record_state: bool = False,
        context: RestartContext = PYTHON,
    ) -> None:
        if hosts and hostfile:
            raise ValueError(BOTH_HOST_SOURCES)
        from mlx_jupyter.vocab import limits
        from mlx_jupyter.cluster.slurm_allocation import for_cluster

        timeout = limits.seconds("timeout=", timeout)   # nan, inf or <= 0 refused as the magics and CLIs refuse them

        self.allocation: Optional[ClusterAllocation] = for_cluster(
            scheduler, slurm, bool(hosts or hostfile), n=n, nodes=nodes, partition=partition, time=time,
            account=account, args=slurm_args, on_failure=on_failure)
        if isinstance(hosts, str):
            hosts = [h.strip() for h in hosts.split(",")]
        self.hosts: list[str] = list(hosts or ["127.0.0.1"])
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
        self.hostfile_hosts: Optional[list[Host]] = list(read.hosts) if read is not None else None
        self.env: Mapping[str, str] = settings.env
        self.notices = settings.notices
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
        if cell_channel is None:
            cell_channel = os.environ.get(rank_env.CELL_CHANNEL, "1") != "0"  # "0": through the controller
        self.cell_channel = cell_channel
        super().__init__(f"mlx-{secrets.token_hex(4)}", settings.backend, context, output=self._rank_output)
        #: the opt-in per-cell record of each rank's own names (a dead rank's, restored at restart)
        self.records = StateRecords(self.cluster_id, bool(record_state))
        self.ready_time: Optional[float] = None
        self.last_restart: Optional[str] = None  # the last restart's one-line report
        self.restart_origins: dict[int, str] = {}   # rank -> where its names came from at the last restart
        # the owner's parts: its listing for the lab panel, its processes
        self.busy_listing = BusyListing(lambda busy: self._publish(busy=busy) if self.running else None)
        # the file lists the dead too: the panel's only word on ranks on other hosts (registry.rank_health)
        self.table.exit_callbacks.append(lambda rank, returncode: self.busy_listing.republish())
        self.processes = ClusterProcesses(self, self.table, self.link, self.startup, self.supervisor,
                                          started=self._publish)

    @classmethod
    def connect(cls, cluster_id: Optional[str] = None, timeout: float = option("timeout").default,
                context: RestartContext = PYTHON) -> ConnectedCluster:
        """A handle on a running cluster another process started (the lab panel, another kernel).

        Cells, push/pull, status and abort work as on a cluster of one's own (through the
        controller); restart and stop of the processes stay with the owner, and ``stop()``
        only disconnects. ``cluster_id`` may be omitted when exactly one cluster is running.
        """
        return ConnectedCluster.connect(cluster_id, timeout, context)

    @property
    def restart_advice(self) -> str:
        """How to get fresh ranks, as it works from where the message is shown."""
        return f"restart the ranks: {self.context.command} ({KEEPS})"

    def gone_advice(self) -> str:
        return f"restart the cluster: {self.context.command} " \
               f"({NEW_CONTROLLER_KEPT if self.cell_server is not None else NEW_CONTROLLER})"

    def expected_size(self) -> int:
        """How many ranks :meth:`start` will start."""
        if self.allocation is not None:
            return (self.allocation.opts.nodes or 1) * self.n
        return len(self.hostfile_hosts if self.hostfile_hosts is not None else self.hosts) * self.n

    # ------------------------------------------------------------ the processes

    def start(self, progress: Optional[ProgressCallback] = None, timeout: Optional[float] = None) -> Cluster:
        """Start controller and ranks; return once every rank's engine is connected with id = rank."""
        t0 = time.perf_counter()
        try:
            self.processes.start(progress, self.timeout if timeout is None else timeout)
        except BaseException:
            if self.allocation is not None:   # a failed start holds no nodes
                self.allocation.release()
            raise
        self.ready_time = time.perf_counter() - t0
        from mlx_jupyter.cluster import registry
        from mlx_jupyter.cluster.rank.keep_files import sweep_stale

        sweep_stale()   # what a restart whose kernel was killed left here (a listing of one folder)
        registry.sweep()   # and the entries and key files of its clusters
        if self.records.on:
            self.records.switch(self)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every rank, the controller and the client; leave no process behind."""
        from mlx_jupyter.cluster import registry

        self.busy_listing.close()
        registry.unpublish_quietly(self.cluster_id)
        self.processes.stop(timeout)
        self.records.cleanup(self)
        if self.allocation is not None:
            self.allocation.release()
        self.namespaces.forget()

    def restart(self, progress: Optional[ProgressCallback] = None, timeout: Optional[float] = None,
                clean: bool = False, quiet: bool = False) -> Cluster:
        """Fresh processes for every rank (a new MLX ``world``, a new ``group``), same ranks, same
        engine ids; the controller stays. By default each rank's user names are kept (saved on its
        own host, restored into the new rank of the same number: :mod:`.kept_state`) and one line
        says what was kept and what was not (cells still running are stopped first); ``clean=True``
        starts the ranks empty."""
        if self.processes.ipp is None or self.link.client is None:
            return self.start(progress, timeout)
        wait = self.timeout if timeout is None else timeout

        def fresh_ranks() -> None:
            self.namespaces.forget()
            self.last_error_rank = None   # the tracebacks went with the old ranks
            self.processes.restart(progress, wait)

        self.last_restart = None
        self.restart_origins = {}
        gone = self.link.controller_gone()
        from mlx_jupyter.cluster import channel_calls

        live = [r for r in self.table.ranks if r not in self.table.dead]
        if clean or (gone and not channel_calls.usable(self.cell_server, live)):   # nothing to save the names through
            fresh_ranks()
            self.last_restart = f"restart: {self.size} ranks started empty ({'--clean' if clean else NEW_CONTROLLER})"
            if self.records.on:
                self.records.switch(self)
            return self
        from mlx_jupyter.cluster.kept_state import restart_keeping

        self.last_restart = restart_keeping(self, fresh_ranks, origins=self.restart_origins)
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

    def death_note(self, rank: int) -> str:
        """Why Slurm ended ``rank`` (time limit, node failure), in a few words; empty when it did not."""
        return self.allocation.rank_note(self, rank) if self.allocation is not None else ""

    def _publish(self, busy: Sequence[int] = ()) -> None:
        """List this cluster for the lab panel (a file in Jupyter's runtime dir); never fails start.
        ``busy``: the ranks running a cell (the panel shows them running, the others idle)."""
        from mlx_jupyter.cluster import registry

        registry.publish_quietly(self, self.context.publish_as, busy)

    @property
    def ipp(self) -> Any:
        """ipyparallel's Cluster (controller and engine set) while running."""
        return self.processes.ipp

    @property
    def cell_server(self) -> Optional[CellServer]:
        """The direct cell channel's server (None without one, or while stopped)."""
        return self.processes.cell_server

    @property
    def engine_set(self) -> MLXEngineSetLauncher:
        return self.processes.engine_set

    def rank_infos(self) -> list[RankInfo]:
        """Each rank's launch record (rank, host, pid, state)."""
        return self.processes.rank_infos()

    def _rank_output(self) -> dict[int, list[str]]:
        """Each rank's last lines of process output (engine logs, native stderr)."""
        return {int(rank): list(lines) for rank, lines in self.engine_set.rank_output.items()}

    # ------------------------------------------------------------ what a cell run needs (cells.run.RunHost)

    def run_started(self, run: CellRun) -> None:
        super().run_started(run)
        self.busy_listing.started(run)   # listed running only if it lasts: a short cell writes nothing

    def run_ended(self, run: CellRun) -> None:
        super().run_ended(run)
        self.busy_listing.ended(run)
