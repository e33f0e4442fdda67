"""The live table under a running cell: where each rank is, updated in place.

Shown once the cell has run :data:`THRESHOLD` s and a rank has not progressed: it has waited on
a peer at the same place for :data:`STUCK` s (a short cell, or a healthy loop, shows nothing), updated when
what it says changes (at most every :data:`PERIOD` s), from the samples the ranks send
(:meth:`CellRun.channel_where`). When the cell ends the table collapses to one line: the
cell's own output (and its error, which lists every rank) says the rest, and a table frozen
at its last state would be wrong about ranks that moved on after the last sample.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping, Optional, Protocol

from mlx_jupyter.where import model

#: seconds a cell runs before the table appears
THRESHOLD = 1.0
#: seconds between two updates at most
PERIOD = 0.25
#: seconds a rank waits on a peer at the same place before the table shows (watched from THRESHOLD / 2)
STUCK = 0.5


class SampledRun(Protocol):
    """What the table reads of a cell run (:class:`~.run.CellRun` is one)."""

    @property
    def started(self) -> float: ...  # time.monotonic() of its start
    @property
    def done(self) -> threading.Event: ...
    @property
    def samples(self) -> Mapping[int, dict[str, Any]]: ...  # rank -> its latest sample
    def where_rows(self, samples: Optional[Mapping[int, dict[str, Any]]] = None) -> list[model.RankRow]: ...


def _display(data: dict[str, Any]) -> Any:
    from IPython.display import display

    return display(data, raw=True, display_id=True)  # type: ignore[no-untyped-call]  # IPython's, untyped


class LiveTable:
    """Shows and updates ``run``'s table through ``show`` (returns a handle with ``update``)."""

    def __init__(self, run: SampledRun, show: Optional[Callable[[dict[str, Any]], Any]] = None, threshold: float = THRESHOLD,
                 poll: Optional[Callable[[], Mapping[int, dict[str, Any]]]] = None):
        self.run = run
        self.show = show or _display
        self.threshold = threshold
        self.poll = poll  # rank -> sample, asked for when no samples come (cells through the controller)
        self.handle: Any = None
        self.last: Optional[dict[str, Any]] = None
        self._next = 0.0
        self.shown = 0  # updates made (tests)
        self._waits: dict[int, tuple[str, float]] = {}  # rank -> (the place it waits on a peer at, since)

    def tick(self, now: Optional[float] = None) -> None:
        """Show or update the table if it is time (called by the display loop)."""
        now = time.monotonic() if now is None else now
        elapsed = now - self.run.started
        if elapsed < self.threshold / 2 or now < self._next or self.run.done.is_set():
            return
        self._next = now + PERIOD
        samples = self.run.samples
        if not samples and self.poll is not None:
            try:
                samples = self.poll()
            except Exception:
                samples = {}
        rows = self.run.where_rows(samples)
        if self.handle is None and not self._stuck(rows, now) or elapsed < self.threshold:
            return
        data = model.bundle(rows, f"where the ranks are, {elapsed:.0f} s into the cell")
        if data == self.last:
            return
        self.last = data
        try:
            if self.handle is None:
                self.handle = self.show(data)
            else:
                self.handle.update(data, raw=True)
            self.shown += 1
        except Exception:  # a front end without display updates: no live table
            self.handle = None
            self._next = float("inf")

    def _stuck(self, rows: list[model.RankRow], now: float) -> bool:
        """Has a rank waited on a peer at the same place for :data:`STUCK` s (a healthy loop moves on)?"""
        waits = {}
        for row in rows:
            if model.waits_on_peer(row):
                place, since = self._waits.get(row.rank, (row.place, now))
                waits[row.rank] = (row.place, since if place == row.place else now)
        self._waits = waits
        return any(now - since >= STUCK for _, since in waits.values())

    def finish(self) -> None:
        """The cell ended: collapse the table to one line (nothing if it never showed)."""
        if self.handle is None:
            return
        took = time.monotonic() - self.run.started
        rows = self.run.where_rows()
        states: dict[str, list[int]] = {}
        for row in rows:
            states.setdefault(row.state.split(" ")[0], []).append(row.rank)
        text = f"the cell ran {took:.1f} s: " + "; ".join(f"{model.rank_words(r)} {s}" for s, r in states.items())
        try:
            self.handle.update({"text/plain": text}, raw=True)
        except Exception:
            pass
