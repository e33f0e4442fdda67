"""A cell run's events, as its reader takes them (:meth:`~.run.CellRun.next_event`), and their queue."""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any

#: the event put once the whole run has ended (after ``done`` is set), waking a reader that waits
FINISHED = "finished"


@dataclass
class Event:
    """``kind`` is ``stream`` (payload: (name, text)), ``display``, ``result`` (payload: content),
    ``debug`` (payload: (text, prompt or None, done), a rank's pdb session), ``end`` (a rank's), ``notice``
    (rank -1, payload: a line the run says while it ends, e.g. that stopped ranks finish an evaluation), or
    :data:`FINISHED` (rank -1: the run is over, ``done`` is set; the last event of a run)."""

    kind: str
    rank: int
    payload: Any = None


class EventQueue(queue.Queue["Event"]):
    """A run's events; :meth:`put_quiet` queues one without waking a reader."""

    def put_quiet(self, event: "Event") -> None:
        """Queue ``event`` for the reader's next look (its poll, or the next event that wakes it): a
        thread woken for it would only compete for a core with the ranks still running the cell."""
        with self.mutex:
            self._put(event)
            self.unfinished_tasks += 1
