"""The speed guard's rows and verdict (guard.py measures): each row is ours against a reference
timed in the same run, as a ratio of medians, failed when above its limit. No timing here."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

#: row key -> the limit on ours / reference. Each sits above the ratio this 2-core machine kind gives,
#: quiet or loaded (docs/performance.md, "The speed guard"), with room for noise, and below twice the
#: quiet ratio where the reference allows it, so that our side taking twice as long fails:
LIMITS: dict[str, float] = {
    # trivial cell vs ipyparallel's %%px: issue 30 sets 1.0 (the goal is 0.5)
    "cell": 1.0,
    # MLX all_sum cell vs the same all_sum timed inside the ranks: 1.2 to 1.5 measured under load (the
    # all_sum slows more than the notebook's part); quiet, a ~6 ms cell beside a ~6 ms all_sum (MLX's
    # ring at 0.74 GB/s, benchmarks/results/allreduce.txt) gives about 2, and 2x the whole cell fails
    "all_sum_cell": 3.0,
    # cold start of 2 ranks vs ipyparallel's: 0.12 quiet (benchmarks/results/cells.txt), 0.18 to 0.43
    # at load 11 to 13 (ipyparallel's start waits on fixed intervals, ours is CPU, so the ratio grows
    # with the load): 2x fails under load; quiet, only a start 5x slower fails
    "start": 0.6,
    # our core's all_sum vs Open MPI at 4 KiB and 64 MiB: about 0.5 quiet, lower under load
    "core_4k": 0.9,
    "core_64m": 0.9,
}


@dataclass
class Row:
    """``ours`` and ``theirs``: samples in seconds, measured alternately in one run."""

    key: str
    what: str
    reference: str
    ours: list[float] = field(default_factory=list)
    theirs: list[float] = field(default_factory=list)
    limit: Optional[float] = None  # None: shown, not checked
    missing: str = ""  # why the reference did not run (and how to make it run)

    def __post_init__(self) -> None:
        if self.limit is None and self.key in LIMITS:
            self.limit = LIMITS[self.key]

    @property
    def ratio(self) -> Optional[float]:
        """median(ours) / median(theirs); None when a side has no samples."""
        if not self.ours or not self.theirs:
            return None
        return statistics.median(self.ours) / statistics.median(self.theirs)

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return "NOT RUN"
        if self.limit is None:
            return "info"
        return "ok" if self.ratio <= self.limit else "FAIL"


def failed(rows: list[Row], allow_missing: bool = False) -> list[Row]:
    """The rows that fail the guard: above their limit, or (unless ``allow_missing``) not run."""
    return [r for r in rows if r.verdict == "FAIL" or (r.verdict == "NOT RUN" and not allow_missing)]


def _time(samples: list[float]) -> str:
    if not samples:
        return "-"
    t = statistics.median(samples)
    return f"{t * 1e3:.2f} ms" if t >= 1e-3 else f"{t * 1e6:.2f} us"


def table(rows: list[Row]) -> str:
    """The guard's table: per row both medians, the ratio, its limit and the verdict."""
    head = ("check", "ours", "reference", "ratio", "limit", "verdict")
    body = [(f"{r.what} vs {r.reference}", _time(r.ours), _time(r.theirs),
             "-" if r.ratio is None else f"{r.ratio:.3f}", "-" if r.limit is None else f"{r.limit:.2f}",
             r.verdict + (f" ({r.missing})" if r.missing and r.verdict == "NOT RUN" else ""))
            for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head) - 1)]
    lines = []
    for line in [head, *body]:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
                     + "  " + line[-1])
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
