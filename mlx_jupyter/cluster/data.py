"""Data between the notebook and the ranks: push, pull, scatter and gather, each supervised."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.rank_table import RankTable
from mlx_jupyter.cluster.supervision import Supervisor


class DataMover:
    """Moves names and values to and from the ranks of ``table`` through ``link``'s views;
    ``supervisor`` refuses dead or busy ranks and waits (a death or the stop button ends the wait)."""

    def __init__(self, link: ControllerLink, table: RankTable, supervisor: Supervisor) -> None:
        self.link, self.table, self.supervisor = link, table, supervisor

    def _targets(self, targets: Optional[Sequence[int]]) -> list[int]:
        ranks = self.supervisor.select(targets)
        self.supervisor.check_ranks(ranks)
        return ranks

    def push(self, ns: Mapping[str, Any], targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> None:
        """Define the names of ``ns`` in every target rank's namespace."""
        ranks = self._targets(targets)
        self.supervisor.wait(self.link.view(ranks).push(dict(ns), block=False), timeout, ranks, "push")

    def pull(self, names: str | Sequence[str], targets: Optional[Sequence[int]] = None,
             timeout: float = 60.0) -> list[Any]:
        """The value(s) of ``names`` on each target rank, in rank order."""
        ranks = self._targets(targets)
        out = self.supervisor.wait(self.link.view(ranks).pull(names, block=False), timeout, ranks, "pull")
        return list(out) if len(ranks) > 1 or isinstance(out, list) else [out]

    def scatter(self, name: str, seq: Any, targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> None:
        """Split ``seq`` into consecutive parts, part r bound to ``name`` on rank r."""
        ranks = self._targets(targets)
        self.supervisor.wait(self.link.view(ranks).scatter(name, seq, block=False), timeout, ranks, "scatter")

    def gather(self, name: str, targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> Any:
        """Concatenate ``name`` from every rank, in rank order."""
        ranks = self._targets(targets)
        return self.supervisor.wait(self.link.view(ranks).gather(name, block=False), timeout, ranks, "gather")
