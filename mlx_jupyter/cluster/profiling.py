"""Profiles of cells: recording every op on the ranks while a cell runs, and gathering the records.

`Cluster.run(code, profile=True)` (``%%mlx_distributed --profile``) starts recording on the
cell's ranks after their names are ready and before the cell goes; the records are gathered when
asked for (`Cluster.profile()`), once the run has ended, from every rank that is neither dead nor
still busy, and kept on the run (``run.profile``) and as the cluster's last profile. The ranks run
:mod:`mlx_jupyter.where.mlx_profile`'s ``start`` and ``stop``: our core's ops and MLX's own collectives.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.rank_table import RankTable
from mlx_jupyter.cluster.supervision import Supervisor
from mlx_jupyter.collective import recording
from mlx_jupyter.collective.profile import OpRecord
from mlx_jupyter.where import mlx_profile


class RankProfiler:
    """Starts and collects profiles on the ranks of ``table`` through ``link``, waits supervised."""

    def __init__(self, link: ControllerLink, table: RankTable, supervisor: Supervisor) -> None:
        self.link, self.table, self.supervisor = link, table, supervisor
        self.pending: Optional[Any] = None  # the profiled run whose records are still on the ranks
        self.last: dict[int, list[OpRecord]] = {}
        self.missing: list[int] = []  # ranks of the last profile that could not be asked (dead, busy)

    def start(self, ranks: Sequence[int], timeout: float = 10.0) -> None:
        """Every op of ``ranks`` is recorded from now on, MLX's collectives of the next cell timed (a new profile)."""
        ranks = list(ranks)
        ar = self.link.view(ranks).apply_async(mlx_profile.start, recording.DEFAULT_CAPACITY)
        self.supervisor.wait(ar, timeout, ranks, "starting the profile")

    def attach(self, run: Any) -> None:
        """``run`` is profiled: its records are gathered once it has ended."""
        run.profile = None
        self.pending = run

    def collect(self, timeout: float = 10.0) -> dict[int, list[OpRecord]]:
        """The last profiled run's records per rank (gathered now if they are still on the ranks)."""
        run = self.pending
        if run is None or not run.done.is_set():
            return self.last
        self.pending = None
        ranks = [r for r in run.ranks if r not in self.table.dead
                 and not (r in self.table.busy and not self.table.busy[r].done())]
        self.missing = sorted(set(run.ranks) - set(ranks))
        got: dict[int, list[OpRecord]] = {}
        if ranks:
            ar = self.link.view(ranks).apply_async(mlx_profile.stop)
            out = self.supervisor.wait(ar, timeout, ranks, "gathering the profile")
            got = dict(zip(ranks, out if len(ranks) > 1 else [out]))
        self.last = got
        run.profile = got
        return got
