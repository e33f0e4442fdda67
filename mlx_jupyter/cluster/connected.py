"""A handle on a running cluster another process started (the lab panel's server, another kernel):
:class:`ConnectedCluster`, what ``Cluster.connect()`` and ``%mlx_cluster connect`` give.

The owner keeps the processes: it restarts and stops them. The connected handle sends cells,
push/pull, status and aborts through the controller (the direct cell channel lives in the
owner's process) and watches the owner's ranks on this machine (:class:`~.attach.RankWatch`), so
that a rank that dies fails the cell at once; :meth:`ConnectedCluster.stop` only disconnects.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping, NoReturn, Optional, Sequence

from mlx_jupyter.cluster import registry
from mlx_jupyter.cluster.attach import RankWatch, connect_client, find_published, rank_infos
from mlx_jupyter.cluster.restart_context import PYTHON, RestartContext, owner_restart
from mlx_jupyter.cluster.session import ClusterSession
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.startup import ProgressCallback
from mlx_jupyter.vocab.options import option

if TYPE_CHECKING:
    from mlx_jupyter.vocab.rankinfo import RankInfo


class ConnectedCluster(ClusterSession):
    """The cluster the registry lists as ``entry``, through ``client`` (its controller's, every rank
    registered); ``context``: what messages advise. :meth:`connect` finds it and makes the client."""

    def __init__(self, entry: Mapping[str, Any], client: Any, context: RestartContext = PYTHON) -> None:
        #: the owner's last publication of the cluster (registry.describe): who, its ranks, its controller
        self.owner: dict[str, Any] = dict(entry)
        super().__init__(str(entry["id"]), str(entry.get("backend") or "ring"), context,
                         controller_gone=self.controller_gone)
        self.hosts: list[str] = list(entry.get("hosts") or ["127.0.0.1"])
        self.link.attach(client)
        self.table.reset(int(entry.get("size") or len(client.ids)))
        self.watch: Optional[RankWatch] = RankWatch(rank_infos(entry), self.owner_rank_exited, entry,
                                                    self.owner_restarted)
        self.watch.start()

    @classmethod
    def connect(cls, cluster_id: Optional[str] = None, timeout: float = option("timeout").default,
                context: RestartContext = PYTHON) -> ConnectedCluster:
        """A handle on the published cluster ``cluster_id`` (may be omitted when exactly one runs)."""
        from mlx_jupyter.cluster.shared.ipp_compat import check_ipyparallel

        check_ipyparallel()
        entry = find_published(cluster_id)
        return cls(entry, connect_client(entry, timeout), context)

    # ------------------------------------------------------------ the owner, in words

    def owner_text(self) -> str:
        return f"{self.owner.get('owner', 'another process')} (pid {self.owner.get('owner_pid', '?')})"

    @property
    def by_server(self) -> bool:
        """Whether the Jupyter server owns it (the lab panel's cluster)."""
        return bool(self.owner.get("owner") == "server")

    def owner_restart_advice(self) -> str:
        """How a notebook connected to this cluster gets fresh ranks: only where the owner is."""
        return owner_restart(self.by_server)

    def stopped_advice(self) -> Optional[str]:
        """Once the owner stopped the cluster: what works from here; None while it is published."""
        if registry.entry(self.cluster_id) is not None:
            return None
        return self.context.after_owner_stopped(self.cluster_id)

    @property
    def restart_advice(self) -> str:
        return self.stopped_advice() or (f"{self.owner_restart_advice()} "
                                         f"(this notebook is only connected to {self.cluster_id})")

    def gone_advice(self) -> str:
        return self.stopped_advice() or self.owner_restart_advice()

    def controller_gone(self) -> str:
        """Why the owner's controller is gone ("" while its process runs, or when unknown)."""
        pid = self.owner.get("controller_pid")
        if not isinstance(pid, int) or registry.alive(self.owner, "controller"):
            return ""
        return f"the cluster's controller (pid {pid}, started by {self.owner_text()}) is dead"

    def gone(self) -> Optional[str]:
        """Why the cluster no longer runs (its owner ended, or stopped it); None while it runs."""
        pid = self.owner.get("owner_pid")
        if pid and not registry.alive(self.owner):
            who = "the Jupyter server that started it" if self.by_server else f"the kernel that started it (pid {pid})"
            return f"{who} has ended, and the cluster with it"
        if registry.entry(self.cluster_id) is None:
            return ("it was stopped with the MLX Cluster panel's Stop button" if self.by_server else
                    "it was stopped where it was started (the MLX Cluster panel's Stop, or %mlx_cluster stop there)")
        return None

    def cell_holding(self, ranks: Sequence[int]) -> Optional[str]:
        """Which of ``ranks`` run a cell of the owner now, whose and since when (the owner lists its
        cells that last: :mod:`.busy_listing`); None when none does."""
        from mlx_jupyter.cluster.cells.text import rank_label

        entry = registry.entry(self.cluster_id)
        busy = sorted(set(entry.get("busy") or []) & set(ranks)) if entry else []
        if entry is None or not busy:
            return None
        since = float(entry.get("published") or time.time())
        who = f"the {entry.get('owner', 'process')} with pid {entry.get('owner_pid', '?')}"
        return (f"{rank_label(busy)} {'is' if len(busy) == 1 else 'are'} running a cell of {who} (which started "
                f"{self.cluster_id}) since {time.strftime('%H:%M:%S', time.localtime(since))}, "
                f"{max(time.time() - since, 0):.0f} s ago")

    # ------------------------------------------------------------ the owner's ranks

    def rank_infos(self) -> list[RankInfo]:
        """The owner's ranks as it last published them (rank, host, pid)."""
        return rank_infos(self.owner)

    def check_ranks(self, ranks: Sequence[int]) -> None:
        if self.watch is not None and any(r in self.dead for r in ranks):
            self.watch.poll()   # the owner may have just restarted them (the panel's Restart)
        super().check_ranks(ranks)

    def owner_rank_exited(self, rank: int, returncode: Optional[int]) -> None:
        """One of the owner's ranks ended: the connected runs waiting on it end (the owner, not this
        handle, tells the controller: its new rank may already have taken the id)."""
        self.table.died(rank, returncode)
        self.supervisor.rank_died(rank, returncode)
        self.table.announce_exit(rank, returncode)

    def owner_restarted(self, entry: dict[str, Any]) -> None:
        """The owner restarted the ranks (the panel's Restart): same ids, new processes; the product's
        names are set up on them again before the next cell (the user's came back with them)."""
        self.owner = entry
        self.table.reset(int(entry.get("size") or self.table.size))
        self.namespaces.forget()

    # ------------------------------------------------------------ what stays with the owner

    def start(self, progress: Optional[ProgressCallback] = None, timeout: Optional[float] = None) -> NoReturn:
        raise ClusterError(f"{self.cluster_id} was started by {self.owner_text()}: it is already running")

    def restart(self, progress: Optional[ProgressCallback] = None, timeout: Optional[float] = None,
                clean: bool = False, quiet: bool = False) -> NoReturn:
        raise ClusterError(self.stopped_advice() or
                           f"{self.cluster_id} belongs to {self.owner_text()}: {self.owner_restart_advice()}")

    def record(self, on: bool = True) -> NoReturn:
        raise ClusterError(f"the per-cell record of the ranks' names is kept by the owner of {self.cluster_id}, "
                           f"{self.owner_text()}: switch it there")

    def stop(self, timeout: float = 10.0) -> None:
        """Disconnect: the owner keeps the cluster running."""
        if self.watch is not None:
            self.watch.stop()
            self.watch = None
        self.supervisor.interrupt_runs("disconnected from the cluster")
        self.link.close()
        self.table.reset(0)
        self.namespaces.forget()
