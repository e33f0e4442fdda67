"""Reaching a cluster another process started (the lab panel's server, another kernel): its entry in
the registry, a client of its controller, and a watch on its ranks on this machine, so that a rank
that dies fails a connected cell at once instead of leaving it to wait. The handle that uses them
is :class:`~mlx_jupyter.cluster.connected.ConnectedCluster`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Optional

from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.vocab.rankinfo import RUNNING, RankInfo

#: a rank's death, as the watch reports it: (rank, return code: None, the owner's to know)
ExitReport = Callable[[int, Optional[int]], None]


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


def rank_infos(entry: Mapping[str, Any]) -> list[RankInfo]:
    """The owner's ranks as the status rows read them (rank, host, pid, state)."""
    return [RankInfo(int(r["rank"]), str(r.get("host", "?")), r.get("pid"), RUNNING) for r in entry.get("ranks", [])]


def connect_client(entry: Mapping[str, Any], timeout: float) -> Any:
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


class RankWatch(threading.Thread):
    """Reports the death of a connected cluster's local ranks (by pid) to ``on_exit(rank, None)``;
    after one, and once the owner published the cluster again (it restarted the ranks), watches the
    new ones and tells ``on_restart(entry)``. Ends when the owner no longer publishes the cluster."""

    def __init__(self, infos: list[RankInfo], on_exit: ExitReport, entry: Optional[Mapping[str, Any]] = None,
                 on_restart: Optional[Callable[[dict[str, Any]], None]] = None, period: float = 0.2) -> None:
        super().__init__(name="mlx-attached-rank-watch", daemon=True)
        self.local = self._local(infos)
        self.on_exit, self.on_restart, self.period = on_exit, on_restart, period
        self.cluster_id: Optional[str] = (entry or {}).get("id")
        self.published: float = (entry or {}).get("published", 0)
        self.gone: set[int] = set()
        self.stopped = threading.Event()
        self._lock = threading.Lock()

    @staticmethod
    def _local(infos: list[RankInfo]) -> list[RankInfo]:
        from mlx_jupyter.vocab.hosts import is_local

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
