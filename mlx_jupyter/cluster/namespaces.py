"""The ranks' namespaces: when they get ``mx``, ``world`` and ``group``, and when ``group`` is formed again."""

from __future__ import annotations

from typing import Any

from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.rank_table import RankTable
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.supervision import Supervisor


class RankNamespaces:
    """Defines ``mx``, ``world`` (MLX's group, ``backend``) and ``group`` (our core's) on every rank
    of ``table``, applied through ``link`` under ``supervisor``."""

    def __init__(self, link: ControllerLink, table: RankTable, supervisor: Supervisor, backend: str) -> None:
        self.link, self.table, self.supervisor, self.backend = link, table, supervisor, backend
        self.ready = False  # mx/world/group are defined on every rank
        self.info: dict[int, dict] = {}  # rank -> what its setup said (world, group, group_error)

    def forget(self) -> None:
        """Fresh ranks: nothing is defined on them yet."""
        self.ready = False
        self.info = {}

    def setup(self, world: bool = True, group: bool = True, timeout: float = 60.0) -> dict[int, dict]:
        """Define ``mx``, ``world`` and ``group`` on every rank (all at once: the ring forms)."""
        from mlx_jupyter.cluster.rank import world as rank_world

        ranks = self.table.ranks
        self.supervisor.check_ranks(ranks)
        ar = self.link.view(ranks).apply_async(rank_world.setup, self.backend, world, group, timeout)
        infos = self.supervisor.wait(ar, timeout + 5, ranks, "setup of mx/world/group")
        self.info = dict(zip(ranks, infos))
        self.ready = True
        self.table.unsettled = False
        return self.info

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
        from mlx_jupyter.cluster.rank import world as rank_world

        ranks = self.table.ranks
        self.supervisor.check_ranks(ranks)
        ar = self.link.view(ranks).apply_async(rank_world.reform, timeout)
        infos: Any = self.supervisor.wait(ar, timeout + 5, ranks, "re-forming group")
        for r, info in zip(ranks, infos):
            self.info.setdefault(r, {}).update(info)
        errors = {r: i["group_error"] for r, i in zip(ranks, infos) if i.get("group_error")}
        if errors:
            raise ClusterError("re-forming `group` failed: " + "; ".join(f"rank {r}: {e}" for r, e in errors.items()))
        self.table.unsettled = False
        return self.info
