"""Clusters the Jupyter server starts for the lab panel, and the list the panel shows.

Starting and stopping run on one worker thread (ipyparallel's synchronous API wants a thread
without a running loop, and one thread keeps a cluster's start and stop in order); the server's
event loop only awaits them, and a cluster handle is made in a thread too (it may resolve host
names). A hostfile is read by :mod:`.hostfile_field` (confined to the server's root, off the loop).
Every cluster, ours or a kernel's, is listed from the registry, and read live the same way: its
ranks' where samples, ours through our handle, a kernel's through a handle of :mod:`.watched`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar

from mlx_jupyter.cluster import last_profile, registry
from mlx_jupyter.cluster.restart_context import PANEL, owner_restart
from mlx_jupyter.server.hostfile_field import CheckedHostfile, HostfileReader
from mlx_jupyter.server.live import LiveState, Look
from mlx_jupyter.server.owners import KernelPids, label_owner
from mlx_jupyter.hostfile import default_ranks_per_host
from mlx_jupyter.server.requests import check_total
from mlx_jupyter.server.watched import WatchedClusters

log = logging.getLogger(__name__)
Factory = Callable[..., Any]
T = TypeVar("T")
#: seconds the server waits for the ranks' status and where answers of one listing
STATUS_TIMEOUT = 0.5


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
    hostfile: Optional[CheckedHostfile] = None
    live: LiveState = field(default_factory=LiveState)   # the dashboard's charts, the stall watch


def _default_factory(**kwargs: Any) -> Any:
    from mlx_jupyter.cluster import Cluster

    return Cluster(**kwargs)


class ClusterManager:
    """The server's clusters; `shutdown()` stops them all."""

    def __init__(self, factory: Factory = _default_factory, start_timeout: float = 60.0,
                 root_dir: Optional[str] = None, allow_hidden: bool = False,
                 kernel_pids: Optional[KernelPids] = None, watched: Optional[WatchedClusters] = None) -> None:
        """``root_dir``: the directory hostfile paths are confined to (the server's; default the cwd);
        ``kernel_pids``: this server's kernels (pid -> notebook path), to tell their clusters from others';
        ``watched``: the handles on clusters the server did not start (made here by default)."""
        self.factory = factory
        self.kernel_pids = kernel_pids
        self.start_timeout = start_timeout
        self.entries: dict[str, Entry] = {}
        self.watched = watched if watched is not None else WatchedClusters()
        self.hostfiles = HostfileReader(root_dir or os.getcwd(), allow_hidden)
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mlx-cluster-manager")

    async def _on_worker(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn)

    async def create(self, n: Optional[int] = None, hosts: Optional[Any] = None, hostfile: Optional[str] = None,
                     backend: Optional[str] = None) -> Entry:
        """A new cluster handle, registered as starting; `start(entry)` starts it. ``n`` None: the
        default ranks per host; ``backend`` None: the hostfile's, else the default (see Cluster).
        A bad hostfile is a `RequestError` naming it (nothing starts)."""
        checked = await self.hostfiles.read(hostfile) if hostfile is not None else None
        extra = {} if backend is None else {"backend": backend}
        # the panel's context: a restart publishes it again as the panel's, and a failed one advises Dismiss
        kwargs = dict(n=n, hosts=hosts, hostfile=checked.copy if checked else None, timeout=self.start_timeout,
                      context=PANEL, **extra)
        try:   # from here on, a refusal removes the hostfile's copy
            if checked is not None:
                check_total(n or default_ranks_per_host(True), len(checked.hostfile.hosts), "hostfile")
            cluster = await asyncio.get_running_loop().run_in_executor(None, lambda: self.factory(**kwargs))
        except BaseException:
            self.hostfiles.forget(checked.copy if checked else None)
            raise
        entry = Entry(cluster, hostfile=checked)
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

    def _stop(self, entry: Entry, failed: bool = False) -> None:
        registry.unpublish(entry.cluster.cluster_id)
        try:
            entry.cluster.stop()
        except Exception as exc:
            if not failed:
                raise
            # a cluster that did not start: whatever of it is left, its entry goes (Dismiss)
            log.warning("cleaning up failed mlx cluster %s: %s", entry.cluster.cluster_id, exc)
        finally:
            self.entries.pop(entry.cluster.cluster_id, None)
            self.hostfiles.forget(entry.hostfile.copy if entry.hostfile else None)

    async def stop(self, cluster_id: str) -> Optional[str]:
        """Stop a cluster this server started (or dismiss one that failed): "stopped" or "removed";
        None if it is not ours."""
        entry = self.entries.get(cluster_id)
        if entry is None:
            return None
        failed = entry.state == "failed"
        entry.state = "removing" if failed else "stopping"
        await self._on_worker(lambda: self._stop(entry, failed))
        return "removed" if failed else "stopped"

    def state_of(self, cluster_id: str) -> Optional[str]:
        """The state of a cluster this server started (None: not ours)."""
        entry = self.entries.get(cluster_id)
        return None if entry is None else entry.state

    def _restart(self, entry: Entry) -> str:
        from mlx_jupyter.cluster.kept_state import RestartNotStarted

        try:
            entry.cluster.restart(quiet=True)
        except RestartNotStarted:   # nothing was stopped: the cluster runs on as it was
            entry.state = "running"
            raise
        except Exception as exc:
            entry.state, entry.error = "failed", str(exc)
            log.warning("mlx cluster %s did not restart: %s", entry.cluster.cluster_id, exc)
            raise
        entry.state = "running"
        return entry.cluster.last_restart or "restarted"

    async def restart(self, cluster_id: str) -> Optional[str]:
        """Restart a cluster this server started, keeping its ranks' names; the one-line report,
        or None if it is not ours. A failure raises (the cluster is then marked failed)."""
        entry = self.entries.get(cluster_id)
        if entry is None:
            return None
        entry.state = "restarting"
        return await self._on_worker(lambda: self._restart(entry))

    def _status(self, entry: Entry) -> tuple[list[dict[str, Any]], Look]:
        """Each rank's status row with ``where`` (its state as the notebook's live table says it) and its
        memory, and the headline when a rank has stalled (:mod:`.live`); the samples feed the charts."""
        cluster = entry.cluster
        try:
            rows = cluster.status(timeout=STATUS_TIMEOUT)
        except Exception as exc:
            return [{"rank": -1, "state": f"status failed: {exc}"}], Look("", "")
        from mlx_jupyter.cluster.restart_origins import status_column

        status_column(cluster, rows)   # "restart": where each rank's names came from at the last restart
        try:  # answered on the control channel, also while a connected notebook's cell runs
            samples = cluster.where_samples(None, STATUS_TIMEOUT)
        except Exception:
            return rows, Look("", "")
        return rows, entry.live.look(time.time(), rows, samples, restart=owner_restart(True))

    async def _ours(self, entry: Entry) -> dict[str, Any]:
        """A cluster this server started, as the panel lists it (live rank status while it runs)."""
        c = entry.cluster
        item = registry.describe(c, owner="server")
        item.update(state=entry.state, error=entry.error, connected=entry.connected, started=entry.started,
                    owner_text="started from this panel")
        if entry.hostfile is not None:
            item["hostfile"] = entry.hostfile.name   # as the panel gave it, not our private copy
        if entry.state == "running":
            rows, look = await asyncio.get_running_loop().run_in_executor(None, lambda: self._status(entry))
            item["ranks"] = [{**r, "health": _health(r)} for r in rows]
            item["diagnosis"], item["story"] = look.headline, look.story
            report = getattr(c, "last_restart", None)
            if isinstance(report, str) and report:
                item["restart_report"] = report   # the last restart's one line (what came back, from where)
        return item

    async def _theirs(self, seen: set[str], only: Optional[str] = None) -> list[dict[str, Any]]:
        """Clusters of kernels and other processes (``only`` that one), from their registry files, labelled
        by owner, each rank read live through the server's handle on it once it has one."""
        kernels = await self._kernel_pids()
        out = []
        loop = asyncio.get_running_loop()
        listed = [item for item in registry.published() if item["id"] not in seen]
        self.watched.keep({item["id"] for item in listed})
        for item in listed:
            if only is not None and item["id"] != only:
                continue
            entry = copy.deepcopy(item)   # the owner's record, for the handle that reads its ranks
            for r in item.get("ranks", []):
                # the registry's "idle"/"running" is what the rank does, not its health: both are alive
                doing = r.get("health")
                if doing in ("idle", "running"):
                    r.update(health="ok", state="idle" if doing == "idle" else "running a cell")
                elif doing == "exited":
                    r["state"] = "exited"
                elif doing == "remote":   # an owner's record without its word on the dead (an older version)
                    r["state"] = "on another host: health from the owning notebook"
            states = {r.get("health") for r in item.get("ranks", [])}
            item["state"] = "running" if states <= {"ok", "remote"} else "degraded"
            item.update(label_owner(item, kernels))
            samples = await loop.run_in_executor(None, self.watched.samples, entry, STATUS_TIMEOUT)
            live = self.watched.live(item["id"])
            if samples is not None and live is not None:
                # the server's short wait may miss a busy rank's answer: the owner's words stay, not "no reply"
                look = live.look(time.time(), item.get("ranks", []), samples, say_no_reply=False,
                                 restart=owner_restart(item.get("owner") == "server"))
                item["diagnosis"], item["story"] = look.headline, look.story
            out.append(item)
        return out

    async def _kernel_pids(self) -> Optional[dict[int, str]]:
        if self.kernel_pids is None:
            return None
        try:
            return await self.kernel_pids()
        except Exception as exc:   # the card then says "kernel pid N" without telling whose
            log.debug("could not list this server's kernels: %s", exc)
            return None

    async def _with_slurm(self, items: list[dict[str, Any]]) -> None:
        """A Slurm cluster's job, as squeue shows it now: state, nodes, time left."""
        loop = asyncio.get_running_loop()
        for item in items:
            job = (item.get("slurm") or {}).get("job_id")
            if job is not None:
                from mlx_jupyter.cluster.slurm_allocation import job_info

                item["slurm"].update(await loop.run_in_executor(None, job_info, int(job)))

    async def listing(self) -> list[dict[str, Any]]:
        """Every cluster: ours with live rank status, kernels' from their registry files."""
        out = [await self._ours(entry) for entry in list(self.entries.values())]
        out += await self._theirs({item["id"] for item in out})
        await self._with_slurm(out)
        return out

    async def dashboard(self, cluster_id: str, since: Optional[float] = None) -> Optional[dict[str, Any]]:
        """One cluster for its dashboard: as listed, with its ranks' recent series (the points after
        ``since``) and its last ``--profile`` timeline; None if there is no such cluster."""
        entry = self.entries.get(cluster_id)
        if entry is not None:
            item = await self._ours(entry)
            item["series"] = entry.live.history.series(since)
        else:
            theirs = await self._theirs(set(self.entries), only=cluster_id)
            if not theirs:
                return None
            item = theirs[0]
            live = self.watched.live(cluster_id)
            item["series"] = live.history.series(since) if live is not None else {"window": 0, "ranks": {}}
        await self._with_slurm([item])
        item["profile"] = await asyncio.get_running_loop().run_in_executor(None, last_profile.load, cluster_id)
        return item

    def shutdown(self) -> None:
        """Stop every cluster this server started (server exit)."""
        for cid in list(self.entries):
            try:
                self._worker.submit(self._stop, self.entries[cid]).result(30)
            except Exception as exc:  # keep stopping the others
                log.warning("stopping mlx cluster %s failed: %s", cid, exc)
        self._worker.shutdown(wait=False)
        self.watched.close()
        self.hostfiles.close()


def _health(row: dict[str, Any]) -> str:
    state = str(row.get("state", ""))
    if state in ("idle", "busy"):
        return "ok"
    return "dead" if state.startswith("dead") else state or "unknown"
