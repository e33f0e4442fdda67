"""The server's read-only handles on clusters it did not start (a kernel's ``%mlx_cluster start``,
another process's), so that they get the same live rows, headline and charts as the panel's own.

A handle is a :class:`~mlx_jupyter.cluster.connected.ConnectedCluster` (a client of the owner's
controller; the ranks answer its where requests on their control channel, as they answer the
owner's). It is made on a thread of its own, so a listing never waits for it: until it is ready,
and for :data:`RETRY` s after a failed attempt, the cluster has no samples. It is let go when the
cluster is no longer published, or is published with another controller (the owner made a new one).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from mlx_jupyter.server.live import LiveState

log = logging.getLogger(__name__)
#: seconds before a failed connection is tried again
RETRY = 10.0
#: seconds a connection waits for the owner's controller and ranks
CONNECT_TIMEOUT = 10.0
Connect = Callable[[Mapping[str, Any]], Any]


def _connect(entry: Mapping[str, Any]) -> Any:
    from mlx_jupyter.cluster.attach import connect_client
    from mlx_jupyter.cluster.connected import ConnectedCluster
    from mlx_jupyter.cluster.restart_context import PANEL
    from mlx_jupyter.cluster.shared.ipp_compat import check_ipyparallel

    check_ipyparallel()
    return ConnectedCluster(entry, connect_client(entry, CONNECT_TIMEOUT), PANEL)


def _key(entry: Mapping[str, Any]) -> tuple[Any, Any]:
    """What names the owner's controller: another key is another controller."""
    return entry.get("client_file"), entry.get("controller_pid")


@dataclass
class _Watch:
    """One cluster's handle (None until connected) and what the server keeps of it between looks."""

    key: tuple[Any, Any]
    handle: Any = None
    pending: Optional[concurrent.futures.Future[Any]] = None
    failed: float = float("-inf")
    live: LiveState = field(default_factory=LiveState)


class WatchedClusters:
    """Handles on the published clusters this server did not start, by id."""

    def __init__(self, connect: Connect = _connect, retry: float = RETRY) -> None:
        self.connect, self.retry = connect, retry
        self.watches: dict[str, _Watch] = {}
        self._lock = threading.Lock()
        self._connector = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mlx-watch-connect")

    def live(self, cluster_id: str) -> Optional[LiveState]:
        """The cluster's series and stall watch (None: never looked at)."""
        watch = self.watches.get(cluster_id)
        return None if watch is None else watch.live

    def samples(self, entry: Mapping[str, Any], timeout: float) -> Optional[dict[int, dict[str, Any]]]:
        """Each rank's where sample (blocks up to ``timeout`` s); None while there is no handle (it is
        then being made, or will be once :data:`RETRY` s have passed since a failure)."""
        handle = self._handle(entry)
        if handle is None:
            return None
        try:
            return dict(handle.where_samples(None, timeout))
        except Exception as exc:   # its controller went away: connect again later
            log.debug("mlx cluster %s: no where samples: %s", entry.get("id"), exc)
            self._drop(str(entry["id"]), failed=True)
            return None

    def _handle(self, entry: Mapping[str, Any]) -> Any:
        cid, key = str(entry["id"]), _key(entry)
        with self._lock:
            watch = self.watches.get(cid)
            if watch is not None and watch.key != key:
                self._close(watch)
                watch = None
            if watch is None:
                watch = self.watches[cid] = _Watch(key)
            if watch.pending is not None and watch.pending.done():
                try:
                    watch.handle = watch.pending.result()
                except Exception as exc:
                    log.debug("mlx cluster %s: cannot watch it: %s", cid, exc)
                    watch.failed = time.monotonic()
                watch.pending = None
            if watch.handle is None and watch.pending is None and time.monotonic() - watch.failed >= self.retry:
                watch.pending = self._connector.submit(self.connect, dict(entry))
            return watch.handle

    def _drop(self, cid: str, failed: bool = False) -> None:
        with self._lock:
            watch = self.watches.get(cid)
            if watch is None:
                return
            self._close(watch)
            watch.handle, watch.pending = None, None
            if failed:
                watch.failed = time.monotonic()

    def keep(self, ids: set[str]) -> None:
        """Let go of the clusters not in ``ids`` (no longer published)."""
        with self._lock:
            for cid in [c for c in self.watches if c not in ids]:
                self._close(self.watches.pop(cid))

    def _close(self, watch: _Watch) -> None:
        handle, pending = watch.handle, watch.pending
        if pending is not None:   # made after all: closed once it is
            pending.add_done_callback(_stop_made)
        if handle is not None:
            _stop(handle)

    def close(self) -> None:
        """Let go of every handle (server exit)."""
        self.keep(set())
        self._connector.shutdown(wait=False)


def _stop_made(made: concurrent.futures.Future[Any]) -> None:
    """Disconnect a handle made after it was let go."""
    if not made.cancelled() and made.exception() is None:
        _stop(made.result())


def _stop(handle: Any) -> None:
    """Disconnect (the owner's cluster runs on)."""
    try:
        handle.stop()
    except Exception as exc:
        log.debug("disconnecting from an mlx cluster: %s", exc)
