"""Recording a profile in this process: every op of every group, from `start()` to `stop()`.

The switch is the native core's (one predictable branch per op while it is off); each group
keeps its records in a bounded ring of its own (the newest ``capacity``), so recording allocates
nothing per op. `stop()` takes the records of every live group; a group freed while recording
hands its records over as it goes.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from mlx_jupyter import _core
from mlx_jupyter.collective import activity
from mlx_jupyter.collective.profile import OpRecord, Summary, summarize, timeline_svg

#: records kept per group by default (about 48 bytes each, allocated once per group and profile)
DEFAULT_CAPACITY = 16384
MAX_CAPACITY = 10**8

_lock = threading.Lock()
_orphans: list[OpRecord] = []  # records of groups freed while recording


def recording() -> bool:
    """Whether ops are being recorded in this process."""
    return bool(_core.profiling())


def start(capacity: int = DEFAULT_CAPACITY) -> None:
    """Record every op of every group of this process from now on (a new profile: earlier records go)."""
    if not 1 <= int(capacity) <= MAX_CAPACITY:
        raise ValueError(f"capacity must be 1 to {MAX_CAPACITY} records per group (about 48 bytes each), "
                         f"got {capacity}")
    with _lock:
        _orphans.clear()
    for group in activity.live_groups():
        group.take_profile(0.0)  # an MLX group's old records (a core group forgets its own on the next record)
    _core.start_profile(int(capacity))


def to_epoch() -> float:
    """Seconds to add to the core's clock (``_core.clock_ns() * 1e-9``) for seconds since the epoch."""
    return time.time() - _core.clock_ns() * 1e-9


def stop() -> list[OpRecord]:
    """Stop recording; every record of this profile, ordered by start time."""
    _core.stop_profile()
    offset = to_epoch()
    out: list[OpRecord] = []
    for group in activity.live_groups():
        out += group.take_profile(offset)
    with _lock:
        out += [_shift(r, offset) for r in _orphans]
        _orphans.clear()
    return sorted(out, key=lambda r: (r.start, r.rank))


def keep_orphans(records: list[OpRecord]) -> None:
    """A freed group's records (on the core's clock: start/end in core seconds), kept for `stop()`."""
    if records:
        with _lock:
            _orphans.extend(records)


def _shift(r: OpRecord, offset: float) -> OpRecord:
    from dataclasses import replace

    return replace(r, start=r.start + offset, end=r.end + offset)


class Profile:
    """What ``with profile() as prof:`` gives: ``prof.records`` once the block ends, and views of them."""

    def __init__(self) -> None:
        self.records: list[OpRecord] = []

    def summary(self) -> Summary:
        return summarize(self.records)

    def svg(self) -> str:
        return timeline_svg(self.records)

    def _repr_svg_(self) -> Optional[str]:
        return self.svg() if self.records else None

    def __repr__(self) -> str:
        return f"<Profile of {len(self.records)} ops; .summary().text, .svg()>"


@contextmanager
def profile(capacity: int = DEFAULT_CAPACITY) -> Iterator[Profile]:
    """Record the ops of the block: ``with profile() as prof: ...`` then ``prof.records``."""
    prof = Profile()
    start(capacity)
    try:
        yield prof
    finally:
        prof.records = stop()


def native_records(core: Any, group_id: str, offset: float) -> list[OpRecord]:
    """A core group's records, taken from the native ring, times shifted by ``offset`` seconds."""
    rows, _dropped = core.take_profile()
    rank, size = core.rank(), core.size()
    return [OpRecord(group_id, rank, size, op, seq, nbytes, dtype, start_ns * 1e-9 + offset, end_ns * 1e-9 + offset,
                     wait_ns * 1e-9, None if waited_on < 0 else waited_on, ok)
            for op, seq, nbytes, dtype, start_ns, end_ns, wait_ns, waited_on, ok in rows]
