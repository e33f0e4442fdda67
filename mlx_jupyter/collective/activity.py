"""What each group of this process is doing now: `snapshot()`, safe from any thread.

Every `Group` (collective/group.py) registers itself here when made, weakly. A core group's activity is
read from the native core without locks (a seqlock of atomics, updated by the op's own thread);
an MLX-backend group's is kept in Python around each call (its state is then "running", never
"waiting": MLX does not say on whom it waits).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class OpActivity:
    """One group's activity on this rank. ``seq``: a collective's number in its group (the same on
    every rank for the same call; for send/recv this rank's count of them); kept when idle, as are
    ``nbytes``, ``dtype`` and ``moved`` of the last op."""

    group_id: str
    rank: int
    size: int
    state: str  # "idle" | "running" | "waiting"
    op: Optional[str]  # "all_sum", "all_gather", "send", "recv", "barrier", ...; None when idle
    seq: int
    nbytes: int
    dtype: str
    elapsed: float  # seconds in this op
    waiting_on: Optional[int]  # the group rank this op waits for now
    moved: int  # payload bytes sent and received so far in this op
    backend: str = "ring"
    aborted: bool = False
    timeout: Optional[float] = None  # the running op's timeout in seconds; None: none (or not known)


_live: "weakref.WeakSet[Any]" = weakref.WeakSet()
_live_lock = threading.Lock()  # only group creation and snapshot() take it, never an op


def register(group: Any) -> None:
    """Count ``group`` (anything with ``activity() -> OpActivity``) among the live groups."""
    with _live_lock:
        _live.add(group)


def live_groups() -> list[Any]:
    """The groups of this process still referenced, in no particular order."""
    with _live_lock:
        return list(_live)


def snapshot() -> list[OpActivity]:
    """The activity of every live group of this process, read without waiting on any op."""
    out = []
    for group in live_groups():
        try:
            out.append(group.activity())
        except Exception:  # a group torn down meanwhile: it has no activity to show
            continue
    return out
