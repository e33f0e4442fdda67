"""Showing a :class:`~mlx_jupyter.cluster.cells.run.CellRun` in the notebook as it happens.

Streams are grouped (or prefixed, or raw) with :mod:`mlx_jupyter.cluster.cells.text`;
rich outputs are published once per group of ranks that produced the same
bundle; the stop button and ``--timeout`` turn into :meth:`CellRun.interrupt`;
a failed run ends in :class:`DistributedCellError`, whose traceback lists every
failing rank's own traceback.
"""

from __future__ import annotations

import re
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol, Sequence, TypeVar

from mlx_jupyter.cluster.cells.debug import ControlHost, DebuggedRun, DebugSessions
from mlx_jupyter.cluster.cells.open_line import OpenLine
from mlx_jupyter.cluster.cells.progress_lines import LiveLines, Show
from mlx_jupyter.cluster.cells.outcome import ERROR, OK, RELEASED, RankOutcome
from mlx_jupyter.cluster.cells.text import (FinishedBar, LineGrouper, Writer, group_equal, rank_label, render_outcomes,
                                            summary)

Publish = Callable[[dict[str, Any], dict[str, Any]], None]


class ShownEvent(Protocol):
    """One event of a run (:class:`~.run_events.Event`)."""

    @property
    def kind(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def payload(self) -> Any: ...


class Emptiable(Protocol):
    def empty(self) -> bool: ...


class ShownHost(ControlHost, Protocol):
    """A run's cluster, as far as showing the run reaches it."""

    @property
    def restart_advice(self) -> str: ...  # how to get fresh ranks, as it works where the run is shown
    def where_samples(self, ranks: Optional[Sequence[int]] = None,
                      timeout: float = 1.0) -> Mapping[int, dict[str, Any]]: ...


if TYPE_CHECKING:  # the live table's module loads only in a kernel (its import is deferred)
    from mlx_jupyter.cluster.cells.live import LiveTable, SampledRun

    class ShownRun(DebuggedRun, SampledRun, Protocol):
        """What showing a cell run reads of it (:class:`~.run.CellRun` is one)."""

        @property
        def cluster(self) -> ShownHost: ...
        @property
        def events(self) -> Emptiable: ...
        @property
        def outcomes(self) -> Mapping[int, RankOutcome]: ...
        @property
        def cause(self) -> Optional[str]: ...  # why the run was stopped, if it was
        @property
        def failed(self) -> bool: ...
        @property
        def aborted_ranks(self) -> list[int]: ...
        def next_event(self, timeout: float) -> Optional[ShownEvent]: ...
        def check_deadlines(self) -> None: ...
        def interrupt(self, reason: str = "interrupted by the user") -> None: ...
        def world_closed(self, timeout: float = 1.0) -> dict[int, str]: ...


Run = TypeVar("Run", bound="ShownRun")

#: what MLX's ring prints (once per retry) when its sockets are gone, e.g. after a release
RING_NOISE = re.compile(r"^\[ring\] (Socket \d+ was closed by the peer|(Sending to|Receiving from) socket \d+ "
                        r"failed with errno \d+|Too many send/recv errors\. Failing pending tasks\.\.\.)$")


class DistributedCellError(Exception):
    """A cell failed on some ranks. IPython shows :meth:`_render_traceback_`."""

    def __init__(self, message: str, lines: list[str], outcomes: Optional[list[RankOutcome]] = None):
        super().__init__(message)
        self.lines = lines
        self.outcomes = outcomes

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mDistributedCellError\x1b[0m: {self.args[0]}"] + self.lines


def _publish(data: dict[str, Any], metadata: dict[str, Any]) -> None:
    from IPython.display import publish_display_data

    publish_display_data(data=data, metadata=metadata)  # type: ignore[no-untyped-call]  # IPython's, untyped


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


#: how long a rank's rich output waits for the other ranks' alike one when they may make it: the cell's first,
#: or one of ranks that made others (a figure is no token: a second late costs little, a split pair more)
DISPLAY_HOLD = 1.0


class Displays:
    """Aligns the k-th rich output of every rank and shows identical ones once."""

    def __init__(self, ranks: Sequence[int], hold: float):
        self.hold = hold
        self.queues: dict[int, deque[tuple[float, dict[str, Any]]]] = {r: deque() for r in ranks}
        self.done: set[int] = set()
        self.made: set[int] = set()   # the ranks that made a rich output in this run
        self.shown = False

    def feed(self, rank: int, content: dict[str, Any], now: Optional[float] = None) -> None:
        self.queues.setdefault(rank, deque()).append((time.monotonic() if now is None else now, content))
        self.made.add(rank)

    def flush(self, force: bool = False, now: Optional[float] = None) -> list[tuple[list[int], dict[str, Any]]]:
        out: list[tuple[list[int], dict[str, Any]]] = []
        now = time.monotonic() if now is None else now
        while True:
            heads = {r: q[0] for r, q in self.queues.items() if q}
            if not heads:
                return out
            waiting = [r for r, q in self.queues.items() if not q and r not in self.done]
            likely = not self.shown or not self.made.isdisjoint(waiting)   # the waited-for ranks make them too
            hold = max(self.hold, DISPLAY_HOLD) if likely else self.hold
            if waiting and not force and now - min(t for t, _ in heads.values()) < hold:
                return out
            self.shown = True
            for r in heads:
                self.queues[r].popleft()
            bundles = {r: (c.get("data", {}), c.get("metadata", {})) for r, (_, c) in heads.items()}
            keyed = {r: b[0] for r, b in bundles.items()}
            for ranks, data in group_equal(keyed):
                out.append((ranks, {"data": data, "metadata": bundles[ranks[0]][1]}))


class Renderer:
    """Writes one run's output as it arrives (see the module docstring)."""

    def __init__(self, ranks: Sequence[int], mode: str = "grouped", hold: float = 0.25,
                 out: Optional[Callable[[str], None]] = None, err: Optional[Callable[[str], None]] = None,
                 publish: Optional[Publish] = None, live: Optional[Show] = None, partial_hold: float = 0.05):
        self.ranks = ranks
        self.partial_hold = partial_hold  # an unfinished line waits this long for its end before it shows
        self.mode = mode
        self.out: Writer = out or _stdout
        self.err: Writer = err or _stderr
        self.publish = publish or _publish
        self.streams = {"stdout": LineGrouper(ranks, hold), "stderr": LineGrouper(ranks, hold)}
        self.displays = Displays(ranks, hold)
        self.live = {name: LiveLines(live) for name in self.streams}  # progress lines ("\r"), in place
        self.open = OpenLine({"stdout": lambda t: self.out(t), "stderr": lambda t: self.err(t)}, self._label)
        self.noise: dict[str, tuple[str, int]] = {}  # rank label -> (MLX's first ring error line, how many more)

    def _lines(self, name: str, lines: list[tuple[list[int], str]]) -> str:
        """``[label] line`` for each line (the rest of it where its start is shown); MLX's ring errors kept
        for :meth:`folded_noise`."""
        kept = []
        for ranks, line in lines:
            if name == "stderr" and RING_NOISE.match(line.strip()):
                label = self._label(ranks)
                first, more = self.noise.get(label, (line.strip(), -1))
                self.noise[label] = (first, more + 1)
                continue
            kept.append((ranks, line))
        return self.open.lines(name, kept)

    def _label(self, ranks: Sequence[int]) -> str:
        return rank_label(ranks)

    def close_line(self) -> None:
        """End a rank's line shown in part, before output of another kind (a display, pdb, a summary)."""
        self.open.close()

    def stream(self, rank: int, name: str, text: str) -> None:
        write = self.out if name == "stdout" else self.err
        if self.mode == "raw":
            write(text)
        elif self.mode == "rank":
            self.streams[name].feed(rank, text)
            text = self._lines(name, self.streams[name].flush(force=True))  # complete lines, no alignment
            if text:
                write(text)
        else:
            self.streams[name].feed(rank, text)

    def rich(self, rank: int, content: dict[str, Any], result: bool = False) -> None:
        data = content.get("data", {})
        if result and set(data) <= {"text/plain"}:
            self.stream(rank, "stdout", f"Out: {data.get('text/plain', '')}\n")
            return
        if self.mode == "raw":
            self.publish(data, content.get("metadata", {}))
        else:
            self.displays.feed(rank, content)

    def end(self, rank: int) -> None:
        for g in self.streams.values():
            g.finish(rank)
        self.displays.done.add(rank)

    def flush(self, force: bool = False) -> None:
        if self.mode == "raw":
            return
        for name, g in self.streams.items():
            write = self.out if name == "stdout" else self.err
            started = self.open.started(name)
            lines = g.flush(force=force, eager=started)   # a line shown in part waits for none
            bars = [x for x in lines if isinstance(x[1], FinishedBar)] if name == "stderr" else []
            if bars:  # a finished bar (tqdm writes on stderr) is a success's output, not an error's
                self.out(self._lines("stdout", bars))
                lines = [x for x in lines if not isinstance(x[1], FinishedBar)]
            text = self._lines(name, lines) if lines else ""
            partials = g.partials(age=self.partial_hold, started=started)
            if partials:
                text += self.open.partials(name, partials, self.mode == "grouped")
            if text:
                write(text)
            live = g.live()
            rows = group_equal(live) if self.mode == "grouped" else [([r], line) for r, line in sorted(live.items())]
            if rows and not self.live[name].shown:
                self.close_line()   # the progress lines' display comes below it
            self.live[name].show([(self._label(ranks), line) for ranks, line in rows])
        for ranks, content in self.displays.flush(force=force):
            self.close_line()
            self.out(f"[{self._label(ranks)}]\n")
            self.publish(content["data"], content["metadata"])

    def folded_noise(self) -> list[str]:
        """MLX's ring errors (its sockets closing after a rank's error), one line per label; then forgotten."""
        lines = [f"[{label}] {first}" + (f" (and {n} more MLX ring socket errors like it)" if n else "")
                 for label, (first, n) in self.noise.items()]
        self.noise = {}
        return lines


def _stop(run: ShownRun) -> None:
    """The stop button: the agreed stop where the cluster has it (every rank stops before the same MLX call,
    so no result is drained and the ranks' state stays alike; issue 42), on a thread so the display goes on;
    else an interrupt."""
    stop_soon = getattr(run.cluster, "stop_soon", None)
    if stop_soon is None:
        run.interrupt("interrupted by the user")
    else:
        stop_soon(run)


def _live_table(run: ShownRun) -> Optional[LiveTable]:
    """The live table of where the ranks are (:mod:`.live`), in a kernel only (elsewhere: None)."""
    try:
        from IPython import get_ipython

        ip = get_ipython()
        if ip is None or getattr(ip, "kernel", None) is None:
            return None
    except Exception:
        return None
    from mlx_jupyter.cluster.cells.live import LiveTable

    where = run.cluster.where_samples
    return LiveTable(run, poll=(lambda: where(run.ranks)) if run.via != "channel" else None)


def show_run(run: Run, mode: str = "grouped", timeout: Optional[float] = None,
             renderer: Optional[Renderer] = None, live: bool | LiveTable | None = True) -> Run:
    """Show ``run`` until it ends; interrupt it on KeyboardInterrupt or after ``timeout`` s.

    ``live``: show where the ranks are under the cell while it runs (True: in a kernel; or a
    :class:`~.live.LiveTable`). Returns the run; raises :class:`DistributedCellError` if any rank failed.
    """
    r = renderer or Renderer(run.ranks, mode)
    table = _live_table(run) if live is True else (live or None)
    debug = DebugSessions(run, r.out, table=table)
    deadline = None if timeout is None else time.monotonic() + timeout
    stops = 0
    stopped_at = ""
    while True:
        try:
            ev = run.next_event(0.05)
            while ev is not None:
                if ev.kind == "stream":
                    r.stream(ev.rank, *ev.payload)
                elif ev.kind == "display":
                    r.rich(ev.rank, ev.payload)
                elif ev.kind == "result":
                    r.rich(ev.rank, ev.payload, result=True)
                elif ev.kind == "end":
                    r.end(ev.rank)
                    debug.rank_ended(ev.rank)
                elif ev.kind == "debug":
                    r.flush()
                    r.close_line()
                    debug.event(ev.rank, *ev.payload)
                elif ev.kind == "notice":   # the run's own word while it ends (not a rank's output)
                    r.flush()
                    r.close_line()
                    r.err(f"{ev.payload}\n")
                ev = run.next_event(0) if not run.events.empty() else None
            r.flush()
            if run.done.is_set() and run.events.empty():
                break
            run.check_deadlines()
            debug.tick()  # a pdb prompt that waited for the other ranks to stop too
            if table is not None:
                table.tick()
            if deadline is not None and time.monotonic() > deadline:
                deadline = None
                stopped_at = stopped_at or where_words(run)
                run.interrupt(f"the cell timed out after {timeout:g} s (--timeout)")
        except KeyboardInterrupt:
            debug.stopped = True  # no more prompts: the ranks in pdb are being interrupted
            stops += 1
            stopped_at = stopped_at or where_words(run)
            if stops == 1:
                _stop(run)
            else:   # stopped again: at once, whatever the ranks do
                run.interrupt("interrupted by the user")
            if stops >= 3:  # the user insists: stop waiting, whatever the ranks do
                break
    r.flush(force=True)
    r.close_line()   # a rank's line left unfinished (a rank that died)
    if table is not None:
        table.finish()
    noise = r.folded_noise()
    if run.failed:
        error = failure(run)
        if stopped_at:  # who waited for whom when it was stopped (the live table is gone by now)
            error.lines.insert(0, f"where the ranks were when stopped: {stopped_at}")
        error.lines.extend(noise)  # the cause first, MLX's socket noise folded below it
        raise error
    if noise:
        r.err("".join(f"{line}\n" for line in noise))
    return run


#: seconds a stop waits for the ranks' answers to where they are (a run through the controller has no samples)
STOP_LOOK = 1.0


def where_words(run: ShownRun) -> str:
    """The where table's one-line diagnosis of ``run`` now ("" when the ranks are together, or unknown). A run
    through the controller (a connected notebook's) gets no samples on its own: its ranks are asked on their
    control channel, as its live table asks them."""
    try:
        from mlx_jupyter.where import model

        samples = None
        if not run.samples and run.via != "channel":
            samples = run.cluster.where_samples(run.ranks, STOP_LOOK)
        return model.diagnosis(run.where_rows(samples))
    except Exception:
        return ""


#: a rank's answer for a cell refused because it uses MLX's dead world (rank.names.WorldClosedError)
WORLD_CLOSED = "WorldClosedError"


def failure(run: ShownRun) -> DistributedCellError:
    """The error for a failed run: the cause, each rank's outcome, and hints that offer only what
    works from where they are shown (``run.cluster.restart_advice``)."""
    outcomes = [run.outcomes[r] for r in run.ranks]
    refused = [o for o in outcomes if o.status == ERROR and o.ename == WORLD_CLOSED]
    if refused and all(o.status in (OK, RELEASED) or o.ename == WORLD_CLOSED for o in outcomes):
        return DistributedCellError(refused[0].evalue, [], outcomes)  # one line: the world is dead
    advice = run.cluster.restart_advice
    hints = []
    lost = any("connection to a peer was lost" in o.evalue for o in outcomes)
    closed = run.world_closed() if (run.aborted_ranks or lost) else {}
    drain = f"{run.cause}; not drained: " if run.cause else None   # the drain's reason follows (issue 42)
    now = sorted(r for r, why in closed.items() if run.cause and (why == run.cause or why.startswith(drain or "-")))
    earlier = sorted(set(closed) - set(now))
    if now:
        undrained = next((closed[r][len(drain or ""):] for r in now if drain and closed[r].startswith(drain)), "")
        hints.append(
            f"MLX's `world` was shut down on {rank_label(now)} to release {'it' if len(now) == 1 else 'them'} "
            "from a blocked MLX operation (MLX cannot cancel its collectives"
            + (f"; it could not be drained: {undrained}" if undrained else "") + "). From now on MLX operations "
            "on `world` fail on every rank; our `group` keeps working. For a new `world`, "
            f"{advice}."
        )
    elif earlier:
        hints.append(
            f"MLX's `world` has been shut down since an earlier cell ({rank_label(earlier)}: "
            f"{closed[earlier[0]]}), so MLX operations on it fail. For a new `world`, {advice}."
        )
    cause = f"{run.cause}" if run.cause else summary(outcomes)
    if earlier and not now and lost:
        cause = f"MLX's `world` is shut down (see below): {cause}"
    return DistributedCellError(cause, render_outcomes(outcomes, hints=hints), outcomes)
