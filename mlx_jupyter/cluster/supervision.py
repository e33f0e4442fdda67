"""Supervision: no request to the ranks waits on a dead rank, past its timeout, or after the stop
button; cell runs in flight hear of deaths and of the cluster going away."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Protocol, Sequence

from mlx_jupyter.cluster.cells.targets import check_targets
from mlx_jupyter.cluster.cells.text import rank_label
from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.rank_control import RankControl
from mlx_jupyter.cluster.rank_table import RankTable
from mlx_jupyter.cluster.shared.errors import ClusterError


class Run(Protocol):
    """What supervision needs of a cell run in flight (:class:`~mlx_jupyter.cluster.cells.run.CellRun`)."""

    @property
    def failed(self) -> bool: ...
    @property
    def ranks(self) -> list[int]: ...

    def rank_died(self, rank: int, returncode: Optional[int]) -> None: ...
    def interrupt(self, reason: str = "interrupted by the user") -> None: ...
    def wait(self, timeout: Optional[float] = None) -> bool: ...


class Supervisor:
    """Waits on requests to the ranks of ``table`` (through ``link``), stopping them with
    ``control`` on the stop button; keeps the cell runs in flight. ``restart_advice()`` is how a
    message says to restart the ranks, as it works where the message is shown."""

    def __init__(self, link: ControllerLink, table: RankTable, control: RankControl,
                 restart_advice: Callable[[], str]) -> None:
        self.link, self.table, self.control = link, table, control
        self.restart_advice = restart_advice
        self.runs: set[Run] = set()

    def check_ranks(self, ranks: Sequence[int]) -> None:
        """Raise a clear error if the cluster is not running, or a rank is dead or still busy."""
        self.link.need()
        self.table.check(ranks, self.restart_advice())

    def select(self, targets: Optional[Sequence[int]]) -> list[int]:
        """The ranks ``targets`` names (None: all) once the cluster runs; a
        :class:`~.cells.targets.TargetsError` naming ``targets`` for none or a rank the cluster lacks."""
        self.link.need()
        return check_targets(targets, self.table.size)

    def wait(self, ar: Any, timeout: Optional[float], ranks: Sequence[int], what: str = "the request") -> Any:
        """Wait for an AsyncResult; fail at once if one of ``ranks`` dies, or after ``timeout``.

        A KeyboardInterrupt (the stop button) stops the request on the ranks too
        (:meth:`stop_request`) before it is raised again.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not ar.ready():
                if any(r in self.table.dead for r in ranks):
                    raise ClusterError(self.table.dead_message(f"died during {what}"))
                self.link.need()   # the controller died meanwhile: say so, not wait on it
                if deadline is not None and time.monotonic() > deadline:
                    raise ClusterError(f"{what} did not finish within {timeout:g} s")
                ar.wait(0.05)
        except KeyboardInterrupt:
            left = self.stop_request(ar, ranks, f"{what} interrupted by the user")
            note = f"; {rank_label(left)} did not stop yet (busy)" if left else ""
            raise KeyboardInterrupt(f"{what} interrupted; stopped on the ranks{note}") from None
        return ar.get()

    def stop_request(self, ar: Any, ranks: Sequence[int], reason: str, grace: float = 2.0) -> list[int]:
        """Abort ``ar``'s request on every rank (queued ones never run); the ranks still busy after ``grace`` s."""
        msg_ids = dict(zip(ranks, getattr(ar, "msg_ids", [])))
        self.control.send_abort(reason, ranks, msg_ids)
        self.table.unsettled = True
        end = time.monotonic() + grace
        while not ar.ready() and time.monotonic() < end:
            ar.wait(0.05)
        left = [r for r, m in msg_ids.items() if self.link.outstanding(m)]
        for rank in left:
            self.table.busy[rank] = _Outstanding(self.link, msg_ids[rank])
        return left

    # ------------------------------------------------------------ cell runs in flight

    def run_started(self, run: Run) -> None:
        self.runs.add(run)

    def run_ended(self, run: Run) -> None:
        self.runs.discard(run)

    def rank_died(self, rank: int, returncode: Optional[int]) -> None:
        for run in list(self.runs):
            run.rank_died(rank, returncode)

    def interrupt_runs(self, reason: str) -> None:
        for run in list(self.runs):
            run.interrupt(reason)


class _Outstanding:
    """A request the client still waits for, as :meth:`RankTable.check` asks (``done()``)."""

    def __init__(self, link: ControllerLink, msg_id: str):
        self.link, self.msg_id = link, msg_id

    def done(self) -> bool:
        return not self.link.outstanding(self.msg_id)
