"""Where this rank is, while a cell runs: samples sent to the notebook a few times a second.

While a cell that came on the cell channel runs, one thread of the rank samples the main
thread's stack and our core's activity (:mod:`mlx_jupyter.where.sample`) every :data:`INTERVAL` s
and posts ``where {id, s}`` on the channel. The first sample goes out only after :data:`FIRST` s,
so short cells send nothing, and cost nothing: a cell's start and end only note it under a lock.
The thread is not woken for them: it looks every :data:`INTERVAL` s while cells come, and sleeps
for good after :data:`IDLE` s without one (the next cell wakes it). A thread started, or woken, per
cell cost a trivial cell two thread switches on the rank's critical path (milliseconds on a
loaded machine).
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
#: seconds without a cell after which the sampler's thread stops looking until a cell wakes it
IDLE = 10.0


class CellSampler:
    """Samples the cells of ``kernel`` (rank ``rank``) and answers where requests."""

    def __init__(self, kernel: Any, rank: int, post: Any = None):
        self.kernel = kernel
        self.rank = rank
        self.post = post  # callable(dict) sending on the cell channel (None: find the channel per cell)
        self.cpu = sample.CpuMeter()
        self._running = False
        self._cond = threading.Condition()
        self._cell: Optional[tuple[str, Any]] = None  # the running channel cell's id and channel post
        self._serial = 0  # cells begun: the thread tells the cell it sampled from a later one
        self._began = 0.0  # time.monotonic() the current (or last) cell began
        self._last = 0.0  # time.monotonic() a cell last began or ended
        self._thread: Optional[threading.Thread] = None
        self._asleep = True  # the thread waits without a timeout: the next channel cell must wake it

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
        if mlx_calls.RECORD is not None:
            mlx_calls.new_cell()  # every rank starts the cell: the ranks' MLX collectives count from 1 again
        elif "mlx.core" in sys.modules:
            mlx_calls.install()
        parent = self.kernel.get_parent("shell") if hasattr(self.kernel, "get_parent") else {}
        header = (parent or {}).get("header", {})
        post = self._channel_post() if header.get("session") == CHANNEL_SESSION else None
        with self._cond:
            self._running = True
            self._serial += 1
            self._began = self._last = time.monotonic()
            self._cell = None if post is None else (str(header.get("msg_id", "")), post)
            if self._cell is None or not self._asleep:
                return  # a looking thread finds the cell by itself
            self._asleep = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="mlx-where-sampler", daemon=True)
                self._thread.start()
            else:
                self._cond.notify()

    def _post_run_cell(self, result: Any = None) -> None:
        with self._cond:
            self._running = False
            cell, self._cell = self._cell, None
            self._last = time.monotonic()
        record = mlx_calls.RECORD
        if record is not None and cell is not None and any(record.counts.values()):
            # the cell made MLX collective calls: its last word on them, for a peer still waiting in one
            # that does not match (MLX's ring lets one side finish a mismatched collective)
            try:
                cell[1]({"t": "where", "id": cell[0], "s": {"rank": self.rank, "time": time.time(), "final": True,
                                                            "mlx": mlx_calls.snapshot()}})
            except Exception:
                pass

    def take(self) -> dict[str, Any]:
        """A sample now (any thread)."""
        out = sample.take(None, self.rank, self.cpu, rss(), running=self._running)
        from mlx_jupyter.cluster.rank import agent
        from mlx_jupyter.cluster.rank.names import NAMES

        # MLX's world shut down here (world_closed), or known dead from a peer's (world_dead): the panel's story
        out["world_closed"] = agent.AGENT.world_closed if agent.AGENT is not None else ""
        out["cell"] = agent.AGENT.cell if agent.AGENT is not None else None   # the requests begun: a peer's same one
        out["world_dead"] = NAMES.world_dead
        return out

    def _loop(self) -> None:
        """The sampler's thread: samples the running channel cell from :data:`FIRST` s on."""
        failed = 0  # the cell whose post failed: a sampler never fails the cell, it stops sampling it
        while True:
            with self._cond:
                now = time.monotonic()
                cell, serial = self._cell, self._serial
                if cell is None or serial == failed:
                    if now - self._last >= IDLE:
                        self._asleep = True
                        self._cond.wait_for(lambda: not self._asleep)
                    else:
                        self._cond.wait(INTERVAL)
                    continue
                if now < self._began + FIRST:
                    self._cond.wait(self._began + FIRST - now)
                    continue
            try:
                cell[1]({"t": "where", "id": cell[0], "s": self.take()})
            except Exception:
                failed = serial
                continue
            with self._cond:
                if self._serial == serial:
                    self._cond.wait(INTERVAL)

    def _on_where(self, stream: Any, idents: Any, parent: dict[str, Any]) -> None:
        content = {"status": "ok", **self.take()}
        self.kernel.session.send(stream, "mlx_where_reply", content, parent=parent, ident=idents)


#: this rank's sampler, once installed
SAMPLER: Optional[CellSampler] = None


def install(kernel: Any, rank: int) -> CellSampler:
    """Install this process's sampler (called by :mod:`mlx_jupyter.cluster.rank.engine`)."""
    global SAMPLER
    SAMPLER = CellSampler(kernel, rank).install()
    return SAMPLER
