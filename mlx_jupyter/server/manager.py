"""Clusters the Jupyter server starts for the lab panel, and the list the panel shows.

Starting and stopping run on one worker thread (ipyparallel's synchronous API wants a thread
without a running loop, and one thread keeps a cluster's start and stop in order); the server's
event loop only awaits them. Every cluster, ours or a kernel's, is listed from the registry.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from mlx_jupyter.cluster import registry

log = logging.getLogger(__name__)
Factory = Callable[..., Any]


def connect_code(cluster_id: str) -> str:
    """A cell that connects a notebook's kernel to a running cluster: ``%%mlx_distributed`` then runs there."""
    return (
        "%load_ext mlx_jupyter\n"
        f"%mlx_cluster connect {cluster_id}"
    )


@dataclass
class Entry:
    """A cluster this server started: its handle, state and last error."""

    cluster: Any
    state: str = "starting"  # starting, running, stopping, failed
    error: str = ""
    connected: int = 0
    started: float = field(default_factory=time.time)


def _default_factory(**kwargs: Any) -> Any:
    from mlx_jupyter.cluster import Cluster

    return Cluster(**kwargs)


class ClusterManager:
    """The server's clusters; `shutdown()` stops them all."""

    def __init__(self, factory: Factory = _default_factory, start_timeout: float = 60.0) -> None:
        self.factory = factory
        self.start_timeout = start_timeout
        self.entries: dict[str, Entry] = {}
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mlx-cluster-manager")

    async def _on_worker(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn)

    def create(self, n: Optional[int] = None, hosts: Optional[str] = None, hostfile: Optional[str] = None,
               backend: Optional[str] = None) -> Entry:
        """A new cluster handle, registered as starting; `start(entry)` starts it. ``n`` None: the
        default ranks per host; ``backend`` None: the hostfile's, else the default (see Cluster)."""
        if hostfile is not None:
            hostfile = _readable_hostfile(hostfile)
        extra = {} if backend is None else {"backend": backend}
        cluster = self.factory(n=n, hosts=hosts, hostfile=hostfile, timeout=self.start_timeout, **extra)
        entry = Entry(cluster)
        self.entries[cluster.cluster_id] = entry
        return entry

    def _start(self, entry: Entry) -> None:
        def progress(have: int, total: int) -> None:
            entry.connected = have

        try:
            entry.cluster.start(progress=progress)
        except Exception as exc:
            entry.state, entry.error = "failed", str(exc)
            log.warning("mlx cluster %s did not start: %s", entry.cluster.cluster_id, exc)
            return
        entry.state = "running"
        registry.publish(entry.cluster, owner="server")

    async def start(self, entry: Entry) -> Entry:
        await self._on_worker(lambda: self._start(entry))
        return entry

    def _stop(self, entry: Entry) -> None:
        registry.unpublish(entry.cluster.cluster_id)
        try:
            entry.cluster.stop()
        finally:
            self.entries.pop(entry.cluster.cluster_id, None)

    async def stop(self, cluster_id: str) -> bool:
        """Stop a cluster this server started; False if it is not ours."""
        entry = self.entries.get(cluster_id)
        if entry is None:
            return False
        entry.state = "stopping"
        await self._on_worker(lambda: self._stop(entry))
        return True

    def _status(self, entry: Entry) -> list[dict]:
        try:
            return entry.cluster.status(timeout=0.5)
        except Exception as exc:
            return [{"rank": -1, "state": f"status failed: {exc}"}]

    async def listing(self) -> list[dict[str, Any]]:
        """Every cluster: ours with live rank status, kernels' from their registry files."""
        loop = asyncio.get_running_loop()
        out: list[dict[str, Any]] = []
        seen = set()
        for cid, entry in list(self.entries.items()):
            c = entry.cluster
            item = registry.describe(c, owner="server")
            item.update(state=entry.state, error=entry.error, connected=entry.connected, started=entry.started)
            if entry.state == "running":
                rows = await loop.run_in_executor(None, lambda e=entry: self._status(e))
                item["ranks"] = [{**r, "health": _health(r)} for r in rows]
            out.append(item)
            seen.add(cid)
        for item in registry.published():
            if item["id"] in seen:
                continue
            states = {r.get("health") for r in item.get("ranks", [])}
            item["state"] = "running" if states <= {"running", "remote"} else "degraded"
            out.append(item)
        return out

    def shutdown(self) -> None:
        """Stop every cluster this server started (server exit)."""
        for cid in list(self.entries):
            try:
                self._worker.submit(self._stop, self.entries[cid]).result(30)
            except Exception as exc:  # keep stopping the others
                log.warning("stopping mlx cluster %s failed: %s", cid, exc)
        self._worker.shutdown(wait=False)


def _readable_hostfile(path: str) -> str:
    """The hostfile's absolute path, checked now so that the panel's error names it (ValueError)."""
    from mlx_jupyter.hostfile import HostfileError, read_hostfile

    full = os.path.abspath(os.path.expanduser(path))
    try:
        read_hostfile(full)
    except (OSError, HostfileError) as exc:
        raise ValueError(f"hostfile {path}: {exc}") from None
    return full


def _health(row: dict) -> str:
    state = str(row.get("state", ""))
    if state in ("idle", "busy"):
        return "ok"
    return "dead" if state.startswith("dead") else state or "unknown"
