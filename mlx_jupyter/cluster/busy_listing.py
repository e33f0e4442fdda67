"""Which ranks run a cell, as the lab panel lists them: written only for cells that last.

The cluster's file (:mod:`mlx_jupyter.cluster.registry`) says which ranks are running. Writing it at
every cell's start and end cost a trivial cell more than its whole run, the end's write holding the
cell's end up. A cell is listed running once it has run :data:`DELAY` s, and idle again when it ends,
both written by one thread of its own (in order, the latest state each time), never by the caller:
a cell that ends sooner writes nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Sequence

#: seconds a cell runs before the panel lists its ranks running (the panel polls every few seconds)
DELAY = 0.3


class BusyListing:
    """Calls ``publish(busy_ranks)`` as cells that last start and end (see the module docstring)."""

    def __init__(self, publish: Callable[[Sequence[int]], None], delay: float = DELAY):
        self._publish = publish
        self.delay = delay
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, list[int]]] = {}  # id of a run not listed yet -> (when it is, its ranks)
        self._listed: dict[int, list[int]] = {}  # id of a run listed running -> its ranks
        self._stale = False  # the file no longer says what _listed says
        self._closed = False
        self._write = threading.Lock()  # held while publishing: close() waits for a write under way
        self._thread: Optional[threading.Thread] = None
        self.writes = 0  # files written (tests)

    def started(self, run: Any) -> None:
        """``run`` (anything with ``ranks``) began: list it once it has lasted ``delay`` s."""
        with self._cond:
            if self._closed:
                return
            self._due[id(run)] = (time.monotonic() + self.delay, list(run.ranks))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="mlx-busy-listing", daemon=True)
                self._thread.start()
            if len(self._due) == 1:  # else the thread already waits for an earlier one
                self._cond.notify()

    def ended(self, run: Any) -> None:
        """``run`` ended: unlisted if it was listed; forgotten, with nothing written, if not."""
        with self._cond:
            self._due.pop(id(run), None)
            if self._listed.pop(id(run), None) is not None:
                self._stale = True
                self._cond.notify()

    def close(self) -> None:
        """Write nothing more (the file is about to go); waits for a write under way."""
        with self._cond:
            self._closed = True
            self._due.clear()
            self._cond.notify()
        with self._write:
            pass

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    now = time.monotonic()
                    for key in [k for k, (due, _) in self._due.items() if due <= now]:
                        self._listed[key] = self._due.pop(key)[1]
                        self._stale = True
                    if self._stale:
                        break
                    self._cond.wait(min(due for due, _ in self._due.values()) - now if self._due else None)
                if self._closed:
                    return
                self._stale = False
                busy = sorted({r for ranks in self._listed.values() for r in ranks})
            with self._write:
                if self._closed:
                    return
                try:
                    self._publish(busy)
                    self.writes += 1
                except Exception:  # the listing never breaks a cell (publish_quietly logs its own failures)
                    pass
