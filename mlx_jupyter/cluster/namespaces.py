"""The ranks' namespaces: when they get ``mx``, ``world`` and ``group``, and when the product's
group is formed again. One policy for every way in: ``%%mlx_distributed``, ``Cluster.run`` from
plain Python, and a notebook connected to a cluster the lab panel started.

- Before the first cell, a setup defines the three names on every rank.
- The product never rebinds a name the user bound: on the ranks, a name is (re)bound only where
  it is absent or still holds the object the product put there (:mod:`.rank.names`).
- After an abort or a failed cell, what the ranks say decides, not "any error": our core's group
  is formed again only where it was aborted (an op of ours was interrupted, or failed on a peer),
  and one line says so; a SyntaxError, or the same error on every rank with nobody inside an op,
  changes nothing and prints nothing. A dead MLX world is marked on every rank, so that a cell
  using it is refused with one line that says how to restart.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from mlx_jupyter.cluster.cells.text import rank_label
from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.rank_control import RankControl
from mlx_jupyter.cluster.rank_table import RankTable
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.shared import world_words
from mlx_jupyter.cluster.supervision import Supervisor


def _stdout(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


class RankNamespaces:
    """Defines ``mx``, ``world`` (MLX's group, ``backend``) and ``group`` (our core's) on every rank
    of ``table``, applied through ``link`` under ``supervisor``; after trouble, asks the ranks
    through ``control`` what is left. ``out(line)`` shows the one-line notes (default: stdout, which
    is the cell's output in a notebook); ``restart_advice()`` is how to restart, from there."""

    def __init__(self, link: ControllerLink, table: RankTable, supervisor: Supervisor, control: RankControl,
                 backend: str, restart_advice: Callable[[], str] = lambda: "",
                 out: Callable[[str], None] = _stdout) -> None:
        self.link, self.table, self.supervisor, self.control = link, table, supervisor, control
        self.backend, self.restart_advice, self.out = backend, restart_advice, out
        self.ready = False  # mx/world/group are defined on every rank
        self.info: dict[int, dict[str, Any]] = {}  # rank -> what its setup said (world, group, group_error, bound)

    def forget(self) -> None:
        """Fresh ranks: nothing is defined on them yet."""
        self.ready = False
        self.info = {}

    # ------------------------------------------------------------ the policy

    def prepare(self) -> None:
        """Before a cell: define the names once; after an abort or a failed cell, settle what is left."""
        if not self.ready:
            info = self.setup()
            errors = {r: i.get("group_error") for r, i in info.items() if i.get("group_error")}
            if errors:
                self.out(f"note: `group` is not defined on {rank_label(errors)}: {next(iter(errors.values()))}")
        elif self.table.unsettled:
            self.settle()

    def settle(self, timeout: float = 2.0) -> None:
        """Ask every rank what the last abort or failure left, and mend only that."""
        replies = self.control.replies(timeout)
        ranks = self.table.ranks
        silent = [r for r in ranks if r not in replies and r not in self.table.dead]
        self.table.unsettled = bool(silent)  # asked again before the next cell
        closed = {r: rep["world_closed"] for r, rep in replies.items() if rep.get("world_closed")}
        if closed:
            self._mark_world_dead(closed, [r for r in ranks if r in replies])
        if any(rep.get("group_aborted") for rep in replies.values()) and not silent:
            info = self.reform()
            bound = [r for r in ranks if info.get(r, {}).get("bound")]
            yours = sorted(set(ranks) - set(bound))
            note = f"; your own `group` is left as it is on {rank_label(yours)}" if yours else ""
            self.out(f"mlx-jupyter: our core's group was aborted; re-formed it as `group` on {rank_label(ranks)}"
                     if not yours else
                     f"mlx-jupyter: our core's group was aborted; re-formed it on {rank_label(ranks)}{note} "
                     "(mlx_jupyter.distributed's ops use the new one by default)")

    def _mark_world_dead(self, closed: dict[int, str], ranks: list[int]) -> None:
        """Every rank learns that MLX's world is dead (it was shut down on ``closed``)."""
        from mlx_jupyter.cluster.rank import world as rank_world

        reason = world_words.reason(rank_label(closed), next(iter(closed.values())))
        ar = self.link.view(ranks).apply_async(rank_world.mark_world_dead, reason, self.restart_advice())
        self.supervisor.wait(ar, 10.0, ranks, "marking MLX's world as shut down")

    # ------------------------------------------------------------ the steps

    def setup(self, world: bool = True, group: bool = True, timeout: float = 60.0) -> dict[int, dict[str, Any]]:
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

    def reform(self, timeout: float = 10.0, attempts: int = 2) -> dict[int, dict[str, Any]]:
        """Form our core's group afresh on every rank (after an abort), bound as ``group`` where that
        name is the product's; retried once."""
        for attempt in range(attempts):
            try:
                return self._reform(timeout)
            except ClusterError:
                if attempt + 1 == attempts:
                    raise
        raise AssertionError("unreachable")

    def _reform(self, timeout: float) -> dict[int, dict[str, Any]]:
        from mlx_jupyter.cluster.rank import world as rank_world

        ranks = self.table.ranks
        self.supervisor.check_ranks(ranks)
        ar = self.link.view(ranks).apply_async(rank_world.reform, timeout)
        infos: list[dict[str, Any]] = self.supervisor.wait(ar, timeout + 5, ranks, "re-forming group")
        for r, info in zip(ranks, infos):
            self.info.setdefault(r, {}).update(info)
        errors = {r: i["group_error"] for r, i in zip(ranks, infos) if i.get("group_error")}
        if errors:
            raise ClusterError("re-forming `group` failed: " + "; ".join(f"rank {r}: {e}" for r, e in errors.items()))
        self.table.unsettled = False
        return self.info
