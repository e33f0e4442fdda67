"""Which ranks run a cell, as the lab panel lists them: written only for cells that last.

The cluster's file (:mod:`mlx_jupyter.cluster.registry`) says which ranks are running. Writing it at
every cell's start and end cost a trivial cell more than its whole run, the end's write holding the
cell's end up. A cell is listed running once it has run :data:`DELAY` s, and idle again when it ends,
both written by one thread of its own (in order, the latest state each time), never by the caller:
a cell that ends sooner writes nothing. Nor does it wake that thread: while cells come, the thread
looks at them every :data:`DELAY` s by itself, and it sleeps for good after :data:`IDLE` s without
one (the next cell wakes it). A wake-up per cell cost a trivial cell a thread switch at its start.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Sequence

#: seconds a cell runs before the panel lists its ranks running (the panel polls every few seconds)
DELAY = 0.3
#: seconds without a cell after which the thread stops looking until a cell wakes it
IDLE = 10.0


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
        self._asleep = True  # the thread waits without a timeout: a new cell must wake it
        self._last = 0.0  # time.monotonic() a cell last started or ended
        self.writes = 0  # files written (tests)

    def started(self, run: Any) -> None:
        """``run`` (anything with ``ranks``) began: list it once it has lasted ``delay`` s."""
        with self._cond:
            if self._closed:
                return
            self._last = time.monotonic()
            self._due[id(run)] = (self._last + self.delay, list(run.ranks))
            if not self._asleep:
                return  # the looking thread finds it by itself
            self._asleep = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="mlx-busy-listing", daemon=True)
                self._thread.start()
            else:
                self._cond.notify()

    def ended(self, run: Any) -> None:
        """``run`` ended: unlisted if it was listed; forgotten, with nothing written, if not."""
        with self._cond:
            self._last = time.monotonic()
            self._due.pop(id(run), None)
            if self._listed.pop(id(run), None) is not None:
                self._stale = True
                self._cond.notify()

    def republish(self) -> None:
        """Write the file again with the ranks listed now (a rank died: the file says so), on its thread."""
        with self._cond:
            if self._closed:
                return
            self._stale = True
            self._asleep = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="mlx-busy-listing", daemon=True)
                self._thread.start()
            else:
                self._cond.notify_all()

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
                    if self._due or now - self._last < IDLE:  # look again at the next due, or soon
                        self._cond.wait(min([due - now for due, _ in self._due.values()] + [max(self.delay, 0.05)]))
                    else:  # a listed cell's end, a new cell or close() wakes it
                        self._asleep = True
                        self._cond.notify_all()  # for whoever waits to see it asleep (tests)
                        self._cond.wait_for(lambda: not self._asleep or self._stale or self._closed)
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
