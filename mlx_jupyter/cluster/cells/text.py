"""Showing what several ranks printed, once: rank ranges, line grouping, outcomes as text.

Pure: nothing here talks to engines or to IPython. ``%%mlx_distributed``
feeds the events of a cell run in and writes out what comes back.

Modes (``--output``):

- ``grouped`` (default): lines are aligned rank by rank; a line that several
  ranks printed identically is shown once, as ``[ranks 0-3] text``.
- ``rank``: every line as it arrives, as ``[rank 2] text``.
- ``raw``: text as it arrives, unprefixed.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Mapping, Optional, Sequence, TypeVar

from mlx_jupyter.cluster.cells.outcome import DIED, ERROR, NO_REPLY, RELEASED, RankOutcome
from mlx_jupyter.cluster.shared.units import format_bytes as format_bytes  # the one size text, used from here too
from mlx_jupyter.vocab.rankinfo import describe_exit as describe_exit  # the one exit text, used from here too

MODES = ("grouped", "rank", "raw")

T = TypeVar("T")


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 5, 7, 8]`` -> ``"0-3,5,7-8"``."""
    out: list[str] = []
    items = sorted(set(ranks))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


def rank_label(ranks: Iterable[int]) -> str:
    """``"rank 2"`` or ``"ranks 0-3"``."""
    items = sorted(set(ranks))
    return f"rank {items[0]}" if len(items) == 1 else f"ranks {rank_ranges(items)}"


def overwrite(line: str) -> str:
    """``line`` as a terminal shows it: text after a carriage return overwrites from the line's start."""
    shown = ""
    for part in line.split("\r"):
        shown = part + shown[len(part):]
    return shown


class FinishedBar(str):
    """A progress line that ended (a finished tqdm bar): ordinary output, whichever stream wrote it."""


@dataclass
class _RankLines:
    lines: deque[tuple[float, str]] = field(default_factory=deque)  # (arrival time, line without "\n")
    partial: str = ""  # the unfinished line: at most one "\r", before it what is shown
    partial_since: float = 0.0  # when the unfinished line's first piece came
    done: bool = False
    live: bool = False  # the unfinished line is rewritten in place ("\r"): a progress line


class LineGrouper:
    """Aligns one stream (stdout or stderr) rank by rank and groups identical lines.

    ``feed(rank, text)`` as text arrives, ``finish(rank)`` when a rank's cell
    ended, ``flush(now)`` to get the lines ready to show: a line is shown once
    every rank still running has produced its line at that position, or once
    it has waited ``hold`` seconds, or when its rank is done. Each result is
    ``(ranks, line)``.
    """

    def __init__(self, ranks: Sequence[int], hold: float = 0.25):
        self.hold = hold
        self._ranks = {r: _RankLines() for r in ranks}

    def feed(self, rank: int, text: str, now: Optional[float] = None) -> None:
        st = self._ranks.setdefault(rank, _RankLines())
        now = time.monotonic() if now is None else now
        parts = (st.partial + text).split("\n")
        partial = parts.pop()
        for i, line in enumerate(parts):
            was_live = "\r" in line.rstrip("\r") or (i == 0 and st.live)  # "text\r\n" is no bar
            st.lines.append((now, FinishedBar(overwrite(line)) if was_live else overwrite(line)))
        st.live = "\r" in partial or (st.live and not parts)
        if "\r" in partial:  # kept short: what is shown, then what was written since the last \r (the cursor)
            shown, _, since = partial.rpartition("\r")
            partial = overwrite(shown) + "\r" + since
        if partial and (parts or not st.partial):
            st.partial_since = now
        st.partial = partial

    def live(self) -> dict[int, str]:
        """Each rank's unfinished progress line (one rewritten with ``\\r``), as shown now."""
        return {r: overwrite(st.partial) for r, st in self._ranks.items() if st.live and overwrite(st.partial)}

    def partials(self, now: Optional[float] = None, age: float = 0.0,
                 started: Collection[int] = ()) -> dict[int, str]:
        """Each rank's unfinished line (not a progress line) whose earlier lines have all been flushed, once it
        is ``age`` s old (a print's text and its newline often come apart) or its start is shown (``started``)."""
        now = time.monotonic() if now is None else now
        return {r: st.partial for r, st in self._ranks.items() if st.partial and not st.live and not st.lines
                and (r in started or now - st.partial_since >= age)}

    def finish(self, rank: int, now: Optional[float] = None) -> None:
        st = self._ranks.setdefault(rank, _RankLines())
        if overwrite(st.partial):
            line = overwrite(st.partial)
            st.lines.append((time.monotonic() if now is None else now, FinishedBar(line) if st.live else line))
        st.partial, st.live = "", False
        st.done = True

    def pending(self) -> bool:
        return any(st.lines or st.partial for st in self._ranks.values())

    def flush(self, now: Optional[float] = None, force: bool = False,
              eager: Collection[int] = ()) -> list[tuple[list[int], str]]:
        """``eager``: ranks whose next line is shown in part already: it waits for no other rank's."""
        now = time.monotonic() if now is None else now
        out: list[tuple[list[int], str]] = []
        started: Optional[set[int]] = None
        while True:
            heads = {r: st.lines[0] for r, st in self._ranks.items() if st.lines}
            if not heads:
                return out
            if started is None:
                started = set(eager)
            waiting = [r for r, st in self._ranks.items() if not st.lines and not st.done]
            oldest = min(t for t, _ in heads.values())
            if waiting and not force and now - oldest < self.hold and started.isdisjoint(heads):
                return out
            started.difference_update(heads)
            groups: dict[str, list[int]] = {}
            for r in sorted(heads):
                self._ranks[r].lines.popleft()
                groups.setdefault(heads[r][1], []).append(r)
            for line, ranks in sorted(groups.items(), key=lambda kv: kv[1][0]):
                out.append((ranks, line))


def group_equal(items: Mapping[int, T]) -> list[tuple[list[int], T]]:
    """Group ranks whose values compare equal, in rank order of first appearance."""
    groups: list[tuple[list[int], T]] = []
    for rank in sorted(items):
        for ranks, value in groups:
            if value == items[rank]:
                ranks.append(rank)
                break
        else:
            groups.append(([rank], items[rank]))
    return groups


# ---------------------------------------------------------------- outcomes, as text


def render_outcomes(outcomes: Sequence[RankOutcome], cause: str = "", hints: Sequence[str] = ()) -> list[str]:
    """The lines of a failed cell's error: each failing rank's traceback (identical
    ones shown once), then one line per group of released, dead or silent ranks."""
    lines: list[str] = []
    errors = {o.rank: ("\n".join(o.traceback) or f"{o.ename}: {o.evalue}") for o in outcomes if o.status == ERROR}
    for ranks, tb in group_equal(errors):
        first = next(o for o in outcomes if o.rank == ranks[0])
        lines.append(f"--- {rank_label(ranks)}: {first.ename}: {first.evalue}")
        if str(tb).strip() != f"{first.ename}: {first.evalue}":  # a one-line traceback is the line above
            lines.extend(str(tb).split("\n"))
    released = {o.rank: o.note for o in outcomes if o.status == RELEASED}
    for ranks, note in group_equal(released):
        lines.append(f"--- {rank_label(ranks)}: {note}")
    for o in outcomes:
        if o.status == DIED:
            lines.append(f"--- rank {o.rank}: {o.note}")
    silent = [o.rank for o in outcomes if o.status == NO_REPLY]
    if silent:
        lines.append(f"--- {rank_label(silent)}: {next(o.note for o in outcomes if o.status == NO_REPLY)}")
    if cause:
        lines.insert(0, cause)
    lines.extend(hints)
    return lines


def summary(outcomes: Sequence[RankOutcome]) -> str:
    """One line: which ranks failed how."""
    parts = []
    for status, what in ((ERROR, "raised"), (DIED, "died"), (RELEASED, "stopped"), (NO_REPLY, "did not stop")):
        ranks = [o.rank for o in outcomes if o.status == status]
        if ranks:
            if status == ERROR:
                names = sorted({o.ename for o in outcomes if o.status == ERROR})
                what = f"raised {', '.join(names)}"
            parts.append(f"{rank_label(ranks)} {what}")
    return "; ".join(parts) or "all ranks succeeded"


Writer = Callable[[str], None]
