"""A cluster's recent per-rank time series for its dashboard: CPU, memory (the process's RSS and
MLX's active, peak and cache), collectives per second.

Fed with the ranks' where samples (:mod:`mlx_jupyter.where.sample`) each time the server reads
a cluster's live status, at most one point a second whoever asks (the panel every 2 s, a shown
dashboard every second), and kept in a ring of the last :data:`WINDOW` points per rank. Ops and
bytes per second come from the change of each group's collective count (``seq``) between two
samples; bytes are that count times the group's last op's size (the core keeps no byte total).
MLX's own collectives (``mx.distributed``, every group of MLX's) are columns of their own,
``mlx_ops`` and ``mlx_bytes``, from the change of the rank's totals of them (``mlx_ops`` of the
sample: calls and their inputs' bytes since the rank began recording them, which never restart).
Pure: no I/O, the caller gives the time; one lock, as the panel's and a dashboard's reads of the
same cluster run on two threads.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

#: points kept per rank: fifteen minutes at one a second (the dashboard's widest window)
WINDOW = 900
#: the least time between two points of a rank (a faster reader gets no more points)
MIN_GAP = 0.9
#: a point's fields: time (s), CPU %, RSS bytes, our core's ops/s and bytes/s, MLX's active, peak and cache bytes,
#: MLX's own collectives per second and their bytes per second
COLUMNS = ("t", "cpu", "memory", "ops", "bytes", "mlx_active", "mlx_peak", "mlx_cache", "mlx_ops", "mlx_bytes")


@dataclass
class _Rank:
    """One rank's ring of points (:data:`COLUMNS`) and its last counters."""

    points: deque[tuple[float, *tuple[Optional[float], ...]]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    counters: dict[str, tuple[int, int]] = field(default_factory=dict)
    mlx: Optional[tuple[int, int]] = None   # MLX's totals: calls, bytes
    last: Optional[float] = None


def _counters(sample: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    out = {}
    for entry in sample.get("ops") or []:
        try:
            group, seq, nbytes = entry
            out[str(group)] = (int(seq), int(nbytes))
        except (TypeError, ValueError):
            continue
    return out


def _mlx_totals(sample: Mapping[str, Any]) -> Optional[tuple[int, int]]:
    """MLX's own collectives on the rank so far, (calls, bytes) (None: not recorded there)."""
    totals = sample.get("mlx_ops")
    if not isinstance(totals, Mapping):
        return None
    try:
        return sum(int(v) for v in (totals.get("calls") or {}).values()), int(totals.get("bytes") or 0)
    except (TypeError, ValueError, AttributeError):
        return None


def _mlx_rates(before: Optional[tuple[int, int]], now: Optional[tuple[int, int]],
               seconds: float) -> tuple[Optional[float], Optional[float]]:
    """MLX's calls and bytes per second between two readings of its totals (None: not recorded now); a total
    that went down (the rank is a new process) counts from 0."""
    if now is None:
        return None, None
    calls, nbytes = now
    if before is not None and calls >= before[0] and nbytes >= before[1]:
        calls, nbytes = calls - before[0], nbytes - before[1]
    return calls / seconds, nbytes / seconds


def _mlx(sample: Mapping[str, Any]) -> tuple[Optional[int], ...]:
    """MLX's active, peak and cache bytes (None each where the rank has no MLX, or MLX lacks it)."""
    memory = sample.get("mlx_memory")
    memory = memory if isinstance(memory, Mapping) else {}
    return tuple(int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
                 for v in (memory.get("active"), memory.get("peak"), memory.get("cache")))


def _rates(before: Mapping[str, tuple[int, int]], now: Mapping[str, tuple[int, int]], seconds: float) -> tuple[float, float]:
    """Ops and bytes per second between two readings of the counters. A group made meanwhile counts
    from 0; a count that went down (a group re-formed under the same name) counts from 0 again."""
    ops = nbytes = 0
    for group, (seq, size) in now.items():
        prev = before.get(group, (0, 0))[0]
        done = seq - prev if seq >= prev else seq
        ops += done
        nbytes += done * size
    return ops / seconds, nbytes / seconds


class ClusterHistory:
    """The last ``window`` points of each rank of one cluster."""

    def __init__(self, window: int = WINDOW, min_gap: float = MIN_GAP) -> None:
        self.window, self.min_gap = window, min_gap
        self.ranks: dict[int, _Rank] = {}
        self._lock = threading.Lock()

    def add(self, now: float, samples: Mapping[int, Mapping[str, Any]]) -> int:
        """One point per rank of ``samples`` (rank -> where sample) taken at ``now`` (seconds); a rank
        sampled less than ``min_gap`` s ago is skipped. Returns the points added."""
        with self._lock:
            return self._add(now, samples)

    def _add(self, now: float, samples: Mapping[int, Mapping[str, Any]]) -> int:
        added = 0
        for rank, sample in samples.items():
            r = self.ranks.setdefault(int(rank), _Rank(points=deque(maxlen=self.window)))
            if r.last is not None and now - r.last < self.min_gap:
                continue
            counters, mlx = _counters(sample), _mlx_totals(sample)
            ops = nbytes = mlx_ops = mlx_bytes = None
            if r.last is not None:   # the first point has no rate: nothing to compare it with
                ops, nbytes = _rates(r.counters, counters, now - r.last)
                mlx_ops, mlx_bytes = _mlx_rates(r.mlx, mlx, now - r.last)
            cpu = sample.get("cpu")
            rss = sample.get("rss")
            t = round(now, 2)
            if r.points and t <= r.points[-1][0]:   # one 10 ms apart at least: a reader asks for t > its last
                t = round(r.points[-1][0] + 0.01, 2)
            fields: tuple[Optional[float], ...] = (
                float(cpu) if isinstance(cpu, (int, float)) else None,
                int(rss) if isinstance(rss, (int, float)) and rss else None,
                None if ops is None else round(ops, 2), None if nbytes is None else round(nbytes),
                *_mlx(sample), None if mlx_ops is None else round(mlx_ops, 2),
                None if mlx_bytes is None else round(mlx_bytes))
            r.points.append((t, *fields))
            r.counters, r.mlx, r.last = counters, mlx, now
            added += 1
        return added

    def forget(self, keep: set[int]) -> None:
        """Drop the ranks not in ``keep`` (a smaller cluster after a restart)."""
        with self._lock:
            for rank in list(self.ranks):
                if rank not in keep:
                    del self.ranks[rank]

    def series(self, since: Optional[float] = None) -> dict[str, Any]:
        """The points after ``since`` (all when None), per rank, as columns:
        ``{"window": s, "ranks": {"0": {"t": [...], "cpu": [...], "memory": [...], ...}}}`` (:data:`COLUMNS`)."""
        out: dict[str, Any] = {}
        with self._lock:
            ranks = [(rank, list(r.points)) for rank, r in sorted(self.ranks.items())]
        for rank, kept in ranks:
            points = [p for p in kept if since is None or p[0] > since]
            out[str(rank)] = {name: [p[i] for p in points]
                              for i, name in enumerate(COLUMNS)}
        return {"window": self.window, "ranks": out}
