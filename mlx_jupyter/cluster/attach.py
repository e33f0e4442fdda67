"""Connecting a notebook to a cluster another process started (the lab panel's server, another kernel).

The owner keeps the processes: it restarts and stops them. The connected handle sends cells,
push/pull, status and aborts through the controller (the direct cell channel lives in the
owner's process), and watches the owner's ranks itself, so that a rank that dies fails the
cell at once instead of leaving it to wait.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any, Optional

from mlx_jupyter.cluster.shared.errors import ClusterError


def find_published(cluster_id: Optional[str]) -> dict[str, Any]:
    """The registry's entry for ``cluster_id`` (the only one when None); a clear error otherwise."""
    from mlx_jupyter.cluster import registry

    listed = registry.published()
    ids = [c["id"] for c in listed]
    if cluster_id is None:
        if len(listed) == 1:
            return listed[0]
        if not listed:
            raise ClusterError("no running cluster to connect to: start one in the MLX Cluster panel "
                               "or with %mlx_cluster start")
        raise ClusterError(f"several clusters are running ({', '.join(ids)}): name one, "
                           f"e.g. %mlx_cluster connect {ids[0]}")
    for entry in listed:
        if entry["id"] == cluster_id:
            return entry
    known = f"running: {', '.join(ids)}" if ids else "none is running"
    raise ClusterError(f"no cluster {cluster_id!r} ({known}); the MLX Cluster panel lists them")


def rank_infos(entry: dict[str, Any]) -> list[SimpleNamespace]:
    """The owner's ranks as the status rows read them (rank, host, pid, state)."""
    return [SimpleNamespace(rank=int(r["rank"]), host=str(r.get("host", "?")), pid=r.get("pid"), state="running")
            for r in entry.get("ranks", [])]


def connect_client(entry: dict[str, Any], timeout: float) -> Any:
    """An ipyparallel client of the owner's controller, once every rank is registered."""
    import ipyparallel as ipp

    url_file = entry.get("client_file")
    try:
        client = ipp.Client(url_file, timeout=timeout) if url_file else ipp.Client(cluster_id=entry["id"],
                                                                                 timeout=timeout)
    except Exception as exc:
        raise ClusterError(f"cannot reach the controller of {entry['id']} (owner pid {entry.get('owner_pid')}): "
                           f"{exc}") from None
    size = int(entry.get("size") or 0)
    try:
        client.wait_for_engines(size, timeout=timeout, block=True)
    except Exception:
        client.close(linger=0)
        missing = sorted(set(range(size)) - set(client.ids))
        raise ClusterError(f"{entry['id']}: ranks {missing} are not registered with its controller "
                           f"after {timeout:g} s (is the cluster still starting?)") from None
    return client


def connect(cls: Any, cluster_id: Optional[str], timeout: float) -> Any:
    """``cls.connect``: a handle of class ``cls`` (a Cluster) on the published cluster ``cluster_id``."""
    from mlx_jupyter.cluster.shared.ipp_compat import check_ipyparallel

    check_ipyparallel()
    entry = find_published(cluster_id)
    cluster = cls(n=1, hosts=entry.get("hosts") or None, backend=entry.get("backend") or "ring", cell_channel=False)
    cluster.cluster_id, cluster.owner = entry["id"], entry
    client = connect_client(entry, timeout)
    cluster.link.attach(client)
    cluster.link.controller_gone = lambda: controller_gone(cluster)
    cluster.link.gone_advice = lambda: stopped_advice(cluster) or cluster.owner_restart_advice()
    cluster.table.reset(int(entry.get("size") or len(client.ids)))
    cluster._rank_watch = RankWatch(rank_infos(entry), lambda rank, code: owner_rank_exited(cluster, rank, code),
                                    entry, lambda new: owner_restarted(cluster, new))
    cluster._rank_watch.start()
    return cluster


def controller_gone(cluster: Any) -> str:
    """Why the owner's controller is gone ("" while its process runs, or when unknown)."""
    from mlx_jupyter.cluster import registry

    pid = (cluster.owner or {}).get("controller_pid")
    if not isinstance(pid, int) or registry.pid_alive(pid):
        return ""
    return f"the cluster's controller (pid {pid}, started by {cluster.owner_text()}) is dead"


def owner_rank_exited(cluster: Any, rank: int, returncode: Optional[int]) -> None:
    """One of the owner's ranks ended: the connected runs waiting on it end (the owner, not this
    handle, tells the controller: its new rank may already have taken the id)."""
    cluster.table.died(rank, returncode)
    cluster.supervisor.rank_died(rank, returncode)
    cluster.table.announce_exit(rank, returncode)


def owner_restarted(cluster: Any, entry: dict[str, Any]) -> None:
    """The owner restarted the ranks (the panel's Restart): same ids, new processes; the product's
    names are set up on them again before the next cell (the user's came back with them)."""
    cluster.owner = entry
    cluster.table.reset(int(entry.get("size") or cluster.table.size))
    cluster.namespaces.forget()


def stopped_advice(cluster: Any) -> Optional[str]:
    """For a connected handle whose owner stopped the cluster: what works from here, else None."""
    from mlx_jupyter.cluster import registry

    if cluster.owner is None or registry.entry(cluster.cluster_id) is not None:
        return None
    if cluster.restart_command.startswith("%"):
        return (f"{cluster.cluster_id} was stopped where it was started: %mlx_cluster stop here, then "
                "%mlx_cluster start (or start one in the MLX Cluster panel and connect to it)")
    return (f"{cluster.cluster_id} was stopped where it was started: cluster.stop(), then start a Cluster "
            "of your own or Cluster.connect() to another")


def owner_gone(cluster: Any) -> Optional[str]:
    """For a connected handle whose cluster no longer runs: why (its owner ended, or stopped it), else None."""
    from mlx_jupyter.cluster import registry

    owner = getattr(cluster, "owner", None)
    if owner is None:
        return None
    pid = owner.get("owner_pid")
    server = owner.get("owner") == "server"
    if pid and not registry.pid_alive(pid):
        who = "the Jupyter server that started it" if server else f"the kernel that started it (pid {pid})"
        return f"{who} has ended, and the cluster with it"
    if registry.entry(cluster.cluster_id) is None:
        return ("it was stopped with the MLX Cluster panel's Stop button" if server else
                "it was stopped where it was started (the MLX Cluster panel's Stop, or %mlx_cluster stop there)")
    return None


def owner_cell_holding(cluster: Any, ranks: Any) -> Optional[str]:
    """For a connected handle: which of ``ranks`` run a cell of the owner now, whose and since when
    (the owner lists its cells that last: :mod:`.busy_listing`); None when none does."""
    from mlx_jupyter.cluster import registry
    from mlx_jupyter.cluster.cells.text import rank_label

    owner = getattr(cluster, "owner", None)
    entry = registry.entry(cluster.cluster_id) if owner is not None else None
    busy = sorted(set(entry.get("busy") or []) & set(ranks)) if entry else []
    if not busy:
        return None
    since = float(entry.get("published") or time.time())
    who = f"the {entry.get('owner', 'process')} with pid {entry.get('owner_pid', '?')}"
    return (f"{rank_label(busy)} {'is' if len(busy) == 1 else 'are'} running a cell of {who} (which started "
            f"{cluster.cluster_id}) since {time.strftime('%H:%M:%S', time.localtime(since))}, "
            f"{max(time.time() - since, 0):.0f} s ago")


class RankWatch(threading.Thread):
    """Reports the death of a connected cluster's local ranks (by pid) to ``on_exit(rank, None)``;
    after one, and once the owner published the cluster again (it restarted the ranks), watches the
    new ones and tells ``on_restart(entry)``. Ends when the owner no longer publishes the cluster."""

    def __init__(self, infos: list[SimpleNamespace], on_exit: Any, entry: Optional[dict[str, Any]] = None,
                 on_restart: Any = None, period: float = 0.2) -> None:
        super().__init__(name="mlx-attached-rank-watch", daemon=True)
        self.local = self._local(infos)
        self.on_exit, self.on_restart, self.period = on_exit, on_restart, period
        self.cluster_id = (entry or {}).get("id")
        self.published = (entry or {}).get("published", 0)
        self.gone: set[int] = set()
        self.stopped = threading.Event()
        self._lock = threading.Lock()

    @staticmethod
    def _local(infos: list[SimpleNamespace]) -> list[SimpleNamespace]:
        from mlx_jupyter.net.hosts import is_local

        return [i for i in infos if i.pid and is_local(i.host)]

    def run(self) -> None:
        while self.local and not self.stopped.wait(self.period):
            if self.poll() == "stopped":
                return

    def poll(self) -> str:
        """Look once (the watch's thread, or a caller about to refuse a cell on a dead rank, so that
        a restart the owner just finished is seen at once): "stopped" when the owner stopped the
        cluster, "restarted" when it published new ranks, else ""."""
        from mlx_jupyter.cluster import registry

        with self._lock:
            for info in self.local:
                if info.rank not in self.gone and not registry.pid_alive(info.pid):
                    self.gone.add(info.rank)
                    self.on_exit(info.rank, None)
            if not self.gone or self.on_restart is None or self.cluster_id is None:
                return ""
            entry = registry.entry(self.cluster_id)
            if entry is None:
                return "stopped" if len(self.gone) == len(self.local) else ""
            if entry.get("published", 0) > self.published:
                self.published, self.local, self.gone = entry["published"], self._local(rank_infos(entry)), set()
                self.on_restart(entry)
                return "restarted"
            return ""

    def stop(self) -> None:
        self.stopped.set()
