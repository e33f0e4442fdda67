"""`ClusterStatusWidget`: a live table of a cluster's ranks (host, pid, state, current cell time, memory).

The cell time counts from the rank's own record of when its cell began, so it is exact even
for a widget opened in the middle of a cell.

No polling storm: one daemon thread asks the ranks at most once per `interval` (>= 1 s), and
wakes early only when a rank's process ends (the cluster's exit callback). Only changed rows
reach the browser (traitlets drops equal values); the cell clock ticks in the browser.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Optional

import anywidget
import traitlets

from mlx_jupyter.cluster.cells.text import format_bytes

HERE = Path(__file__).parent
MIN_INTERVAL = 1.0


def rows_from_status(status: list[dict[str, Any]], busy_since: dict[int, float],
                     now: float) -> list[dict[str, Any]]:
    """Rows for the table; `busy_since` (rank -> cell start, epoch s) is updated as ranks start and end cells.

    A rank's own `cell_started` (what `Cluster.status` passes on) is exact; without it the
    start is the first refresh (`now`) that saw the rank busy.
    """
    rows: list[dict[str, Any]] = []   # rank, host, pid, state, busy_since, memory, backend
    for s in status:
        rank = int(s["rank"])
        busy = s.get("state") == "busy"
        started = s.get("cell_started")
        if busy and isinstance(started, (int, float)) and not isinstance(started, bool):
            busy_since[rank] = float(started)
        elif busy:
            busy_since.setdefault(rank, now)
        else:
            busy_since.pop(rank, None)
        state = str(s.get("state", "?"))
        if s.get("world_closed"):
            state += " (world closed)"
        rows.append({"rank": rank, "host": str(s.get("host", "?")), "pid": s.get("pid"), "state": state,
                     "busy_since": busy_since.get(rank), "memory": format_bytes(s.get("memory")),
                     "backend": s.get("backend", "")})
    return rows


class ClusterStatusWidget(anywidget.AnyWidget):
    """Live status of `cluster` (default: the one `%mlx_cluster start` made)."""

    _esm = HERE / "status.js"
    _css = HERE / "status.css"

    rows = traitlets.List(traitlets.Dict()).tag(sync=True)
    message = traitlets.Unicode("").tag(sync=True)
    interval = traitlets.Float(MIN_INTERVAL).tag(sync=True)
    cluster_id = traitlets.Unicode("").tag(sync=True)
    updated = traitlets.Float(0.0).tag(sync=True)  # last time rows changed (epoch s)

    def __init__(self, cluster: Any = None, interval: float = MIN_INTERVAL, autostart: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if cluster is None:
            from mlx_jupyter.magics import current

            cluster = current()
        self.cluster = cluster
        self.interval = max(MIN_INTERVAL, float(interval))
        self.refreshes = 0
        self._busy_since: dict[int, float] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if cluster is not None and hasattr(cluster, "rank_exit_callbacks"):
            cluster.rank_exit_callbacks.append(self._on_rank_exit)
        self.refresh()
        if autostart:
            self.start()

    def _on_rank_exit(self, _rank: int, _code: Any) -> None:
        self._wake.set()

    def refresh(self) -> list[dict[str, Any]]:
        """Ask the ranks once and update the table (sends only what changed)."""
        self.refreshes += 1
        c = self.cluster
        if c is None or not getattr(c, "running", False):
            self.rows, self.message = [], "no cluster running: %mlx_cluster start"
            self._busy_since.clear()
            return []
        try:
            status = c.status(timeout=min(1.0, self.interval))
        except Exception as exc:
            self.message = f"status failed: {type(exc).__name__}: {exc}"
            return list(self.rows)
        rows = rows_from_status(status, self._busy_since, time.time())
        self.cluster_id = str(getattr(c, "cluster_id", ""))
        if rows != self.rows:
            self.rows = rows
            self.updated = time.time()
        self.message = f"{len(rows)} ranks · {getattr(c, 'backend', '')}"
        return rows

    def start(self) -> None:
        """Start the one refresh thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="mlx-cluster-status", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            started = time.monotonic()
            self.refresh()
            # never more than one refresh per interval, even when exits wake us in a burst
            self._stop.wait(max(0.0, MIN_INTERVAL - (time.monotonic() - started)))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the refresh thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    def close(self) -> None:
        self.stop()
        if self.cluster is not None and hasattr(self.cluster, "rank_exit_callbacks"):
            try:
                self.cluster.rank_exit_callbacks.remove(self._on_rank_exit)
            except ValueError:
                pass
        super().close()
