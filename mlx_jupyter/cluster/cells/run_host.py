"""What a cell run (:class:`~.run.CellRun`) needs of its cluster: the :class:`RunHost` protocol and the
records it reads (a session, a connected handle, or a test's fake)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from mlx_jupyter.cluster.cells.cell_server import CellServer
from mlx_jupyter.cluster.cells.debug import ControlSender

class Placed(Protocol):
    """A rank's launch record, as far as a run reads it."""

    @property
    def host(self) -> str: ...


class Request(Protocol):
    """A cell sent to a rank (a cell server's :class:`~.cell_server.Pending`, an ipyparallel future)."""

    def done(self) -> bool: ...


class RunHost(Protocol):
    """What a cell run, and showing it, need of its cluster (:class:`mlx_jupyter.cluster.Cluster` is one)."""

    @property
    def backend(self) -> str: ...
    @property
    def dead(self) -> Mapping[int, Optional[int]]: ...  # rank -> return code, for ranks whose process ended
    @property
    def restart_advice(self) -> str: ...  # how to get fresh ranks, as it works where the run's messages are shown
    @property
    def link(self) -> ControlSender: ...  # a run through the controller asks its ranks' pdbs there

    def channel_for(self, ranks: Sequence[int]) -> Optional[CellServer]: ...  # the direct channel, or None
    def send_execute(self, rank: int, code: str, hook: Callable[[Any], None], cell_number: int = 0,
                     first_line: int = 1) -> str: ...
    def send_abort(self, reason: str, ranks: Sequence[int], msg_ids: Optional[dict[int, str]] = None,
                   drain: bool = False) -> dict[int, Any]: ...
    def drain(self, ranks: Sequence[int], msg_ids: Mapping[int, str],
              on_busy: Optional[Callable[[list[int], bool], None]] = None) -> None: ...  # issue 42: keep MLX's world
    def insist_drain(self) -> None: ...  # stopped again: the drain waits for no evaluation to finish
    def status(self, timeout: float = 1.0) -> list[dict[str, Any]]: ...
    def where_samples(self, ranks: Optional[Sequence[int]] = None,
                      timeout: float = 1.0) -> Mapping[int, dict[str, Any]]: ...  # asked on the control channel
    def rank_infos(self) -> Sequence[Placed]: ...  # each rank's launch record
    def death_note(self, rank: int) -> str: ...  # why Slurm ended ``rank`` (time limit, node failure), or ""
    def controller_lost(self) -> str: ...  # why the controller is gone and what to do, or "" while it runs
    def run_started(self, run: Any) -> None: ...  # a CellRun (typed loosely: run.py imports this module)
    def run_ended(self, run: Any) -> None: ...
    def mark_busy(self, rank: int, request: Request) -> None: ...  # rank still runs request
