"""Where this rank is, while a cell runs: samples sent to the notebook a few times a second.

A cell that came on the cell channel starts a sampler thread (``pre_run_cell``): every
:data:`INTERVAL` s it samples the main thread's stack and our core's activity
(:mod:`mlx_jupyter.where.sample`) and posts ``where {id, s}`` on the channel; the cell's end
stops it. The first sample goes out only after :data:`FIRST` s, so short cells send nothing.
``mlx_where_request`` on the control channel answers one sample at any time (idle or busy):
``Cluster.where()`` and ``%mlx_cluster where``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Optional

from mlx_jupyter.cluster.rank.process import rss
from mlx_jupyter.cluster.shared.wire import CHANNEL_SESSION
from mlx_jupyter.where import mlx_calls, sample

#: seconds between two samples of a running cell
INTERVAL = 0.25
#: seconds a cell runs before its first sample is sent (the notebook shows the table after ~1 s)
FIRST = 0.5


class CellSampler:
    """Samples the cells of ``kernel`` (rank ``rank``) and answers where requests."""

    def __init__(self, kernel: Any, rank: int, post: Any = None):
        self.kernel = kernel
        self.rank = rank
        self.post = post  # callable(dict) sending on the cell channel (None: find the channel per cell)
        self.cpu = sample.CpuMeter()
        self._stop: Optional[threading.Event] = None
        self._running = False
        self._cell: Optional[tuple[str, Any]] = None  # the running cell's id and channel post
        self._lock = threading.Lock()

    def install(self) -> "CellSampler":
        events = self.kernel.shell.events
        events.register("pre_run_cell", self._pre_run_cell)
        events.register("post_run_cell", self._post_run_cell)
        self.kernel.control_handlers["mlx_where_request"] = self._on_where
        return self

    def _channel_post(self) -> Any:
        if self.post is not None:
            return self.post
        from mlx_jupyter.cluster.rank import channel

        ch = channel.CHANNEL
        return ch.post if ch is not None and ch.connected.is_set() else None

    def _pre_run_cell(self, info: Any = None) -> None:
        with self._lock:
            self._running = True
        if mlx_calls.RECORD is not None:
            mlx_calls.new_cell()  # every rank starts the cell: the ranks' MLX collectives count from 1 again
        elif "mlx.core" in sys.modules:
            mlx_calls.install()
        parent = self.kernel.get_parent("shell") if hasattr(self.kernel, "get_parent") else {}
        header = (parent or {}).get("header", {})
        post = self._channel_post()
        if header.get("session") != CHANNEL_SESSION or post is None:
            self._cell = None
            return
        self._cell = (str(header.get("msg_id", "")), post)
        stop = self._stop = threading.Event()
        threading.Thread(target=self._loop, args=(str(header.get("msg_id", "")), stop, post),
                         name="mlx-where-sampler", daemon=True).start()

    def _post_run_cell(self, result: Any = None) -> None:
        with self._lock:
            self._running = False
        if self._stop is not None:
            self._stop.set()
            self._stop = None
        record, cell = mlx_calls.RECORD, self._cell
        if record is not None and cell is not None and any(record.counts.values()):
            # the cell made MLX collective calls: its last word on them, for a peer still waiting in one
            # that does not match (MLX's ring lets one side finish a mismatched collective)
            try:
                cell[1]({"t": "where", "id": cell[0], "s": {"rank": self.rank, "time": time.time(), "final": True,
                                                            "mlx": mlx_calls.snapshot()}})
            except Exception:
                pass

    def take(self) -> dict:
        """A sample now (any thread)."""
        return sample.take(None, self.rank, self.cpu, rss(), running=self._running)

    def _loop(self, msg_id: str, stop: threading.Event, post: Any) -> None:
        if stop.wait(FIRST):
            return
        while not stop.is_set():
            try:
                post({"t": "where", "id": msg_id, "s": self.take()})
            except Exception:  # a sampler never fails the cell
                return
            stop.wait(INTERVAL)

    def _on_where(self, stream: Any, idents: Any, parent: dict) -> None:
        content = {"status": "ok", **self.take()}
        self.kernel.session.send(stream, "mlx_where_reply", content, parent=parent, ident=idents)


#: this rank's sampler, once installed
SAMPLER: Optional[CellSampler] = None


def install(kernel: Any, rank: int) -> CellSampler:
    """Install this process's sampler (called by :mod:`mlx_jupyter.cluster.rank.engine`)."""
    global SAMPLER
    SAMPLER = CellSampler(kernel, rank).install()
    return SAMPLER
