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
    cluster.table.reset(int(entry.get("size") or len(client.ids)))
    cluster._rank_watch = RankWatch(rank_infos(entry), cluster.processes.rank_exited)
    cluster._rank_watch.start()
    return cluster


class RankWatch(threading.Thread):
    """Reports the death of a connected cluster's local ranks (by pid) to ``on_exit(rank, None)``."""

    def __init__(self, infos: list[SimpleNamespace], on_exit: Any, period: float = 0.2) -> None:
        super().__init__(name="mlx-attached-rank-watch", daemon=True)
        from mlx_jupyter.net.hosts import is_local

        self.local = [i for i in infos if i.pid and is_local(i.host)]
        self.on_exit, self.period = on_exit, period
        self.stopped = threading.Event()

    def run(self) -> None:
        from mlx_jupyter.cluster.registry import pid_alive

        left = list(self.local)
        while left and not self.stopped.wait(self.period):
            for info in list(left):
                if not pid_alive(info.pid):
                    left.remove(info)
                    self.on_exit(info.rank, None)

    def stop(self) -> None:
        self.stopped.set()
