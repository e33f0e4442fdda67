"""What a handle on MLX ranks does whoever owns their processes: :class:`ClusterSession`.

The link to the ranks (the ipyparallel client), the rank table, supervision, control, the ranks'
namespaces, data, profiling and cells (run, execute, debug, where). Two handles add what differs:
:class:`~mlx_jupyter.cluster.cluster.Cluster` owns the processes (start, restart, stop, the panel's
listing), :class:`~mlx_jupyter.cluster.connected.ConnectedCluster` uses another process's (watch,
disconnect). Each part is given what it uses:

- :class:`~mlx_jupyter.cluster.rank_table.RankTable`: the ranks, the dead and the busy;
- :class:`~mlx_jupyter.cluster.controller_link.ControllerLink`: the ipyparallel client;
- :class:`~mlx_jupyter.cluster.startup.StartupSequence`: waiting for the ranks of a (re)start;
- :class:`~mlx_jupyter.cluster.rank_control.RankControl`: abort and status on the control channel;
- :class:`~mlx_jupyter.cluster.supervision.Supervisor`: waits that end on a death or the stop button;
- :class:`~mlx_jupyter.cluster.data.DataMover`: push, pull, scatter, gather;
- :class:`~mlx_jupyter.cluster.namespaces.RankNamespaces`: ``mx``, ``world`` and ``group`` on the ranks;
- :class:`~mlx_jupyter.cluster.profiling.RankProfiler`: a profiled cell's records.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, TypeVar

from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.data import DataMover
from mlx_jupyter.cluster.drain import Drainer
from mlx_jupyter.cluster.namespaces import RankNamespaces
from mlx_jupyter.cluster.profiling import RankProfiler
from mlx_jupyter.cluster.rank_control import RankControl
from mlx_jupyter.cluster.rank_table import ExitCallback, RankTable, Request
from mlx_jupyter.cluster.restart_context import RestartContext
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.startup import ProgressCallback, StartupSequence
from mlx_jupyter.cluster.supervision import Supervisor

if TYPE_CHECKING:
    from mlx_jupyter.cluster.cells.cell_server import CellServer
    from mlx_jupyter.cluster.cells.run import CellRun
    from mlx_jupyter.collective.profile import OpRecord
    from mlx_jupyter.vocab.rankinfo import RankInfo
    from mlx_jupyter.where.model import Where

_Session = TypeVar("_Session", bound="ClusterSession")


class ClusterSession(ABC):
    """The ranks of cluster ``cluster_id`` (MLX ``backend``) as seen from this process; ``context``
    says what messages advise for fresh ranks; ``output()`` gives each rank's last output lines,
    ``controller_gone()`` why the controller is gone ("" while it runs). A context manager."""

    def __init__(self, cluster_id: str, backend: str, context: RestartContext,
                 output: Callable[[], Mapping[int, Sequence[str]]] = dict,
                 controller_gone: Callable[[], str] = lambda: "") -> None:
        self.cluster_id = cluster_id
        self.backend = backend
        self.context = context
        #: the first rank that raised in the last failed cell: ``%mlx_debug``'s default
        self.last_error_rank: Optional[int] = None
        self.table = RankTable(output=output)
        self.link = ControllerLink(controller_gone=controller_gone, gone_advice=self.gone_advice)
        self.startup = StartupSequence(self.link, self.table, backend, cell_server=lambda: self.cell_server)
        self.control = RankControl(self.link, self.table, self.startup, backend, self.rank_infos)
        self.supervisor = Supervisor(self.link, self.table, self.control, lambda: self.restart_advice)
        self.data = DataMover(self.link, self.table, self.supervisor)
        self.namespaces = RankNamespaces(self.link, self.table, self.supervisor, self.control, backend,
                                         restart_advice=lambda: self.restart_advice)
        self.profiler = RankProfiler(self.link, self.table, self.supervisor)
        self.drainer = Drainer(self.link, self.table, backend)

    # ------------------------------------------------------------ what each handle says for itself

    @property
    @abstractmethod
    def restart_advice(self) -> str:
        """How to get fresh ranks, as it works from where the message is shown."""

    @abstractmethod
    def gone_advice(self) -> str:
        """What to do once the controller is gone, as it works from where the message is shown."""

    @abstractmethod
    def rank_infos(self) -> list[RankInfo]:
        """Each rank's launch record (rank, host, pid, state)."""

    @abstractmethod
    def start(self, progress: Optional[ProgressCallback] = None,
              timeout: Optional[float] = None) -> ClusterSession:
        """Have every rank running (a connected handle refuses: its owner started them)."""

    @abstractmethod
    def stop(self, timeout: float = 10.0) -> None:
        """Let go of the ranks: stop them (the owner) or disconnect (a connected handle)."""

    def controller_lost(self) -> str:
        """Why the controller is gone and what to do, in one line ("" while it runs)."""
        gone = self.link.controller_gone() if self.link.client is not None else ""
        return f"{gone}; {self.gone_advice()}" if gone else ""

    def death_note(self, rank: int) -> str:
        """Why a scheduler ended ``rank``, in a few words; empty when none did."""
        return ""

    @property
    def cell_server(self) -> Optional[CellServer]:
        """The direct cell channel's server (None without one, or while stopped)."""
        return None

    def __enter__(self: _Session) -> _Session:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
    def busy(self) -> dict[int, Request]:
        return self.table.busy

    @property
    def rank_exit_callbacks(self) -> list[ExitCallback]:
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
    def setup_info(self) -> dict[int, dict[str, Any]]:
        return self.namespaces.info

    @property
    def view(self) -> Any:
        """A blocking DirectView over every rank, in rank order."""
        view = self.link.view(self.ranks)
        view.block = True
        return view

    # ------------------------------------------------------------ what the parts do

    def setup(self, world: bool = True, group: bool = True, timeout: float = 60.0) -> dict[int, dict[str, Any]]:
        """Define ``mx``, ``world`` and ``group`` on every rank; see :class:`RankNamespaces`."""
        return self.namespaces.setup(world, group, timeout)

    def reform(self, timeout: float = 10.0, attempts: int = 2) -> dict[int, dict[str, Any]]:
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

    def status(self, timeout: float = 1.0, forming_grace: float = 2.0) -> list[dict[str, Any]]:
        """One row per rank; see :meth:`RankControl.status`."""
        return self.control.status(timeout, forming_grace)

    def where(self, timeout: float = 1.0) -> Where:
        """Where every rank is now (idle, or the line and the collective of its cell), as a table with a
        one-line diagnosis; works while :meth:`run` is in progress in another thread. See :meth:`RankControl.where`."""
        return self.control.where(timeout)

    def where_samples(self, ranks: Optional[Sequence[int]] = None,
                      timeout: float = 1.0) -> dict[int, dict[str, Any]]:
        """Each rank's latest sample of where it is (the live table's source for cells through the controller)."""
        return self.control.where_samples(ranks, timeout)

    def forming_world(self) -> list[int]:
        """The ranks still forming MLX's world begun after start (they answer nothing meanwhile)."""
        return self.startup.forming_world()

    def check_ranks(self, ranks: Sequence[int]) -> None:
        """Raise a clear error if a rank is dead or still busy with an earlier cell (and why, if Slurm ended it)."""
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

    # ------------------------------------------------------------ cells

    def run(self, code: str, targets: Optional[Sequence[int]] = None, release_deadline: float = 2.0,
            init: bool = True, profile: bool = False, first_line: int = 1) -> CellRun:
        """Start a supervised run of ``code`` on ``targets`` (default all); see :class:`CellRun`.

        ``init``: first define ``mx``, ``world`` and ``group`` on the ranks, or mend them after an
        abort, as :class:`~mlx_jupyter.cluster.namespaces.RankNamespaces` decides (the magics'
        ``--no-init`` turns it off). ``profile``: record every op of our core on the ranks while
        the cell runs; :meth:`profile` gives the records once it has ended. ``first_line``: the
        number of ``code``'s first line in the ranks' tracebacks, pdb and where table (the magics
        give 2: the editor's line 1 is ``%%mlx_distributed``; from Python it is line 1).
        """
        from mlx_jupyter.cluster.cells.run import CellRun

        ranks = self.supervisor.select(targets)
        self.check_ranks(ranks)
        if init:
            self.namespaces.prepare()
        if profile:
            self.profiler.start(ranks)
        run = CellRun(self, code, ranks, release_deadline, first_line)
        if profile:
            self.profiler.attach(run)
        return run.start()

    def execute(self, code: str, targets: Optional[Sequence[int]] = None, timeout: Optional[float] = None,
                init: bool = True) -> list[Optional[str]]:
        """Run ``code`` on the ranks until it ended everywhere: each rank's result, or one error; see :mod:`.execute`."""
        from mlx_jupyter.cluster.execute import execute

        return execute(self, code, targets, timeout, init)

    def profile(self, timeout: float = 10.0) -> dict[int, list[OpRecord]]:
        """The op records (:class:`~mlx_jupyter.collective.profile.OpRecord`) of the last profiled cell, per
        rank; gathered from the ranks once that cell has ended ({} before any)."""
        return self.profiler.collect(timeout)

    def debug(self, rank: Optional[int] = None, commands: str = "") -> CellRun:
        """Start a post-mortem pdb on ``rank``'s last traceback (default: the first rank that raised
        in the last failed cell); ``commands``: ``;``-separated pdb commands run without prompting.
        Returns the :class:`CellRun` (``.display()`` shows it and answers the prompts)."""
        if rank is None:
            rank = self.last_error_rank
            if rank is None:
                raise ClusterError("no cell has raised on a rank since the ranks started: name the rank "
                                   "(%mlx_debug RANK)")
        if rank not in self.ranks:
            raise ClusterError(f"no rank {rank}: the ranks are 0-{self.size - 1}")
        code = ("__import__('mlx_jupyter.cluster.rank.debugger', fromlist=['post_mortem'])"
                f".post_mortem({commands!r})")
        return self.run(code, [rank], init=False)

    # ------------------------------------------------------------ what a cell run needs (cells.run.RunHost)

    def channel_for(self, ranks: Optional[Sequence[int]] = None) -> Optional[CellServer]:
        """The direct cell channel for a cell on ``ranks``, if this cluster has one (see
        :mod:`mlx_jupyter.cluster.cells.cell_server`) and no request through the controller is still running
        on those ranks: a cell sent beside it could overtake it."""
        if self.cell_server is None or self.link.client is None:
            return None
        if ranks and self.link.requests_on(ranks):
            return None
        return self.cell_server

    def send_execute(self, rank: int, code: str, hook: Callable[[Any], None], cell_number: int = 0,
                     first_line: int = 1) -> str:
        """Send ``code`` to ``rank`` through the controller (``cell_number``, ``first_line``: the
        notebook's cell number and the code's first line, for tracebacks)."""
        return self.link.send_execute(rank, code, hook, cell_number, first_line)

    def send_abort(self, reason: str, ranks: Sequence[int],
                   msg_ids: Optional[dict[int, str]] = None, drain: bool = False) -> dict[int, Any]:
        """``mlx_abort_request`` to each rank's control channel; see :meth:`RankControl.send_abort`."""
        return self.control.send_abort(reason, ranks, msg_ids, drain)

    def drain(self, ranks: Sequence[int], msg_ids: Mapping[int, str],
              on_busy: Optional[Callable[[list[int], bool], None]] = None) -> None:
        """After a run's abort: have its stopped ranks make the MLX collectives its blocked ranks wait in
        (``on_busy``: told which ranks still finish an evaluation, and whether they all joined it)."""
        self.drainer.start(ranks, msg_ids, on_busy)

    def insist_drain(self) -> None:
        """The user stopped again: the drain waits for no evaluation to finish (MLX's world is shut down)."""
        self.drainer.insisted.set()

    def stop_soon(self, run: CellRun) -> None:
        """:meth:`stop_at_boundary` on a thread of its own (the stop button's, the chat's: the caller goes on);
        if it fails (the cluster stopped meanwhile), the plain interrupt."""
        def stop() -> None:
            try:
                self.stop_at_boundary(run)
            except Exception:  # noqa: BLE001 - never a thread's traceback in the cell: the interrupt says what it can
                run.interrupt("interrupted by the user")
        threading.Thread(target=stop, name="mlx-stop", daemon=True).start()

    def stop_at_boundary(self, run: CellRun, timeout: float = 1.0) -> bool:
        """Stop ``run`` at a collective boundary (issue 42's agreed stop; a chat's Stop): every rank stops
        before its first MLX call past the last one any rank had made, so all stop at the same call and no
        result is drained. Ranks that made the same calls (nobody waits), or that do not reach the boundary
        within ``timeout`` s, are interrupted as by the stop button. Whether the run ended within ``timeout``."""
        if run.done.is_set():
            return True
        if not self.drainer.agreed_stop(run.ranks, run.msg_ids, timeout):
            run.interrupt("interrupted by the user")
            return run.wait(timeout)
        run.interrupt("interrupted by the user", agreed=True)   # each rank says where it stopped
        if run.wait(timeout):
            return True
        run.interrupt("interrupted by the user: a rank did not reach the agreed stop")   # aborted and drained
        return run.wait(timeout)

    def run_started(self, run: CellRun) -> None:
        self.supervisor.run_started(run)

    def run_ended(self, run: CellRun) -> None:
        if run.first_error is not None:
            self.last_error_rank = run.first_error
        if run.failed:  # what it left is looked at before the next cell (RankNamespaces.settle)
            self.table.unsettled = True
        self.supervisor.run_ended(run)

    def mark_busy(self, rank: int, request: Request) -> None:
        """``rank`` still runs ``request`` (anything with ``done()``): no new cell goes there until it ends."""
        self.table.busy[rank] = request
