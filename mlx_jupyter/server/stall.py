"""Whether the panel's and dashboard's headline (the where diagnosis) is worth showing: a rank that
waits on a peer and has not progressed for :data:`STALL_S` seconds, or MLX calls that do not match.

A healthy loop of collectives is caught waiting on a peer in most looks (each rank waits for the
slower one in every op), so one look is no alarm. Pure: the caller gives the time; one lock, as
the panel's and a dashboard's reads of a cluster run on two threads.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Optional, Sequence

from mlx_jupyter.where import model

#: seconds without progress before a waiting rank is an alarm. The server looks every 1 s (a shown
#: dashboard) or 2 s (the panel): 2 s is at least two looks at the same place, or the rank's own clock
#: (its op's elapsed time, or how long its thread stood still) past what one op of a healthy loop takes
STALL_S = 2.0


def _own_seconds(sample: Optional[Mapping[str, Any]]) -> float:
    """How long the rank says it has been where it is: its running op's elapsed time, or how long its
    main thread stood at one instruction making no MLX call (0 when it says neither)."""
    if not sample:
        return 0.0
    seconds = [a.get("elapsed") for a in sample.get("activity") or []
               if isinstance(a, Mapping) and a.get("state") in ("running", "waiting")]
    seconds.append(sample.get("still"))
    return max((float(s) for s in seconds if isinstance(s, (int, float)) and not isinstance(s, bool)), default=0.0)


class StallWatch:
    """Remembers since when each rank waits at its place (a new op is a new place: progress)."""

    def __init__(self, after: float = STALL_S) -> None:
        self.after = after
        self._since: dict[int, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def stalled(self, now: float, rows: Sequence[model.RankRow], samples: Mapping[int, Mapping[str, Any]]) -> float:
        """The longest a rank of ``rows`` has waited on a peer without progress, in seconds, once that
        is :attr:`after` or more (0.0 below it); a mismatch of MLX calls counts at once (``inf``)."""
        worst = 0.0
        with self._lock:
            since = {}
            for row in rows:
                if not model.waits_on_peer(row):
                    continue
                if row.place.startswith("mismatch"):
                    worst = float("inf")
                    continue
                place, first = self._since.get(row.rank, (row.place, now))
                first = first if place == row.place else now
                since[row.rank] = (row.place, first)
                worst = max(worst, now - first, _own_seconds(samples.get(row.rank)))
            self._since = since
        return worst if worst >= self.after else 0.0

    def headline(self, now: float, rows: Sequence[model.RankRow], samples: Mapping[int, Mapping[str, Any]]) -> str:
        """The diagnosis of ``rows`` when a rank has stalled (see :meth:`stalled`), else ""."""
        stalled = self.stalled(now, rows, samples)   # every look keeps the places up to date
        return model.diagnosis(rows) if stalled else ""
