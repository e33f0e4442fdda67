"""One cell run on several ranks, supervised so that it always ends.

A :class:`CellRun` sends the cell to each target rank, straight over the
cell channel (:mod:`mlx_jupyter.cluster.cells.cell_server`) when every target rank is connected
to it, else as an ipyparallel ``execute_request`` through the controller;
turns what comes back into events (output, results, ends), and keeps the
no-hang promise (aborts and interrupts go through the controller's control
channel either way):

- a rank's cell raises, or its process dies, while others still run: the
  others get ``mlx_abort_request`` naming that rank (see
  :mod:`mlx_jupyter.cluster.rank.agent`) and are released;
- :meth:`interrupt` (the stop button, or ``--timeout``) does the same for all;
- a rank that has not ended ``release_deadline`` seconds after its abort is
  given up on (``no-reply``): the run ends anyway and says so.

Callbacks arrive on the cell server's thread, the thread waiting in :meth:`next_event`
(it reads the cell channel itself: :meth:`CellServer.pump`) or the ipyparallel client's
I/O thread; :meth:`next_event` is called from the notebook's thread.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from mlx_jupyter.vocab import backends
from mlx_jupyter.cluster.cells.cell_server import CellServer, notebook_count
from mlx_jupyter.cluster.cells.replies import is_release_error, reply_content
from mlx_jupyter.cluster.cells.outcome import DIED, ERROR, NO_REPLY, OK, RELEASED, RUNNING, RankOutcome
from mlx_jupyter.cluster.cells.run_events import FINISHED as FINISHED, Event as Event, EventQueue
from mlx_jupyter.cluster.cells.run_host import Placed as Placed, Request as Request, RunHost as RunHost
from mlx_jupyter.cluster.cells.text import describe_exit, rank_label

if TYPE_CHECKING:
    from mlx_jupyter.where.model import RankRow


def finishing_words(ranks: Sequence[int]) -> str:
    """The line shown while stopped ranks finish an MLX evaluation every rank joined."""
    return (f"{rank_label(ranks)} finish an MLX evaluation every rank joined before they stop (MLX cannot cancel one; "
            "MLX's world is kept). Stop again to shut MLX's world down now instead.")


#: how a rank's end is said in the table of where the ranks are
ENDED_WORDS = {OK: "done", ERROR: "raised", RELEASED: "released", DIED: "dead", NO_REPLY: "no reply"}
#: a rank's answer for a cell aborted before it started there (rank.agent.CellAborted)
NOT_STARTED = "CellAborted"
#: how often a run through the controller asks whether the controller still lives (its death ends the run)
CONTROLLER_LOOK = 0.25
#: our core's PeerError for a peer whose host stopped acknowledging (down, or the network cut)
_SILENT_PEER = re.compile(r"rank (\d+) \([^)]*\) stopped responding")


def _safe(fn: Callable[..., None]) -> Callable[..., None]:
    """Callbacks on the client's I/O thread must never raise (it would print into the cell)."""

    def wrapper(*args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # pragma: no cover - a bug; keep the I/O thread alive
            import logging

            logging.getLogger("mlx_jupyter").exception("cell run callback failed")

    return wrapper


class CellRun:
    """A supervised execution of ``code`` on ``ranks``. See the module docstring."""

    def __init__(self, cluster: RunHost, code: str, ranks: list[int], release_deadline: float = 2.0, first_line: int = 1):
        self.cluster = cluster
        self.code, self.first_line = code, first_line  # first_line: its number on the ranks (2 under the magic)
        self.ranks = list(ranks)
        self.release_deadline = release_deadline
        self.events: EventQueue = EventQueue()
        self.outcomes = {r: RankOutcome(r, status=RUNNING) for r in self.ranks}
        self.cause: Optional[str] = None
        #: op records per rank, once gathered, when the run was profiled (Cluster.profile())
        self.profile: Optional[dict[int, list[Any]]] = None
        self.started = 0.0
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._replied: set[int] = set()
        self._idle: set[int] = set()
        self._ended: set[int] = set()
        self._abort_sent: dict[int, float] = {}
        self._agreed: set[int] = set()   # ranks told where to stop (an agreed stop), sent no abort yet
        self._drained = False   # the run's drain has begun
        self._told_finishing = False   # the reader was told the ranks finish an evaluation before they stop
        self._silent: set[int] = set()   # ranks a peer found unreachable: their host is down or cut off
        self.msg_ids: dict[int, str] = {}
        self._futures: dict[int, Any] = {}
        self.samples: dict[int, dict[str, Any]] = {}  # rank -> its latest sample of where it is (mlx_jupyter.where)
        self.first_error: Optional[int] = None  # the first rank whose own error ended its cell
        self.cell_server: Optional[CellServer] = None  # the cell channel, when the cell went through it
        self.via = ""  # "channel" (straight to the ranks) or "controller" (ipyparallel's execute_request)
        self._controller_looked = 0.0

    # ------------------------------------------------------------ sending

    def start(self) -> "CellRun":
        self.started = time.monotonic()
        self.cluster.run_started(self)
        live = [r for r in self.ranks if r not in self.cluster.dead]
        for rank in self.ranks:
            if rank in self.cluster.dead:
                self.rank_died(rank, self.cluster.dead[rank])
        cell_server = self.cluster.channel_for(live)
        if cell_server is not None and cell_server.connected(live):
            self.via, self.cell_server = "channel", cell_server
            base = uuid.uuid4().hex  # one per cell: a rank's id is this and its rank
            self.msg_ids.update({rank: f"{base}-{rank}" for rank in live})
            self._futures.update(cell_server.send_cells({r: self.msg_ids[r] for r in live}, self.code, self, self.first_line))
            return self
        self.via = "controller"
        number = notebook_count()   # the rank's tracebacks say Cell In[N] with the notebook's N
        for rank in live:
            self.msg_ids[rank] = self.cluster.send_execute(rank, self.code, partial(self._hook, rank), number, self.first_line)
        return self

    def _hook(self, rank: int, fut: Any) -> None:
        self._futures[rank] = fut
        fut.iopub_callbacks.append(_safe(partial(self._on_iopub, rank)))
        fut.add_done_callback(_safe(partial(self._on_reply, rank)))
        fut.output.add_done_callback(_safe(partial(self._on_idle, rank)))

    # ------------------------------------------------------------ callbacks (I/O thread)

    def _on_iopub(self, rank: int, msg: dict[str, Any]) -> None:
        self.channel_output(rank, msg["header"]["msg_type"], msg["content"])

    # ------------------------------------------------------------ callbacks (cell channel's thread)

    def channel_output(self, rank: int, kind: str, content: dict[str, Any]) -> None:
        if kind == "stream":
            self.events.put(Event("stream", rank, (content.get("name", "stdout"), content.get("text", ""))))
        elif kind == "display_data":
            self.events.put(Event("display", rank, content))
        elif kind == "execute_result":
            self.events.put(Event("result", rank, content))

    def channel_where(self, rank: int, sample: dict[str, Any]) -> None:
        """A sample of where ``rank`` is (the cell channel's thread)."""
        self.samples[rank] = sample

    def where_rows(self, samples: Optional[Mapping[int, dict[str, Any]]] = None) -> list[RankRow]:
        """Where each rank is, as :func:`mlx_jupyter.where.model.rows` says it (the latest samples)."""
        from mlx_jupyter.where import model

        ended = {r: ENDED_WORDS[o.status] for r, o in self.outcomes.items() if o.status in ENDED_WORDS}
        return model.rows(self.samples if samples is None else samples, ended, self.ranks)
    def channel_debug(self, rank: int, text: str, prompt: Optional[str], done: bool = False) -> None:
        """A rank's pdb wrote ``text``; with a ``prompt`` it waits for :meth:`answer_debug`; ``done``:
        its session ended (the cell goes on)."""
        self.events.put(Event("debug", rank, (text, prompt, done)))

    def answer_debug(self, rank: int, line: Optional[str]) -> None:
        """Send ``rank``'s pdb its next line (None: this front end cannot prompt)."""
        if self.cell_server is not None:
            self.cell_server.send_debug_line(rank, line)

    def channel_reply(self, rank: int, content: dict[str, Any]) -> None:
        """The rank's reply, after all its outputs (one socket, in order): the rank's end."""
        if content.get("ename") == "ChannelError":   # the rank went away: Slurm may say why (time limit, node)
            why = self.cluster.death_note(rank)
            if why:
                content = {**content, "evalue": f"{content.get('evalue', '')}; {why}"}
        self._record_reply(rank, content)
        self._on_idle(rank)

    def _on_reply(self, rank: int, fut: Any) -> None:
        content = reply_content(fut)
        if content.get("ename") == "EngineError":   # ipyparallel saw the engine die before the launcher told us
            self.rank_died(rank, None)
            return
        self._record_reply(rank, content)

    def _record_reply(self, rank: int, content: dict[str, Any]) -> None:
        outcome = self.outcomes[rank]
        with self._lock:
            if outcome.status != RUNNING:
                return
            self._replied.add(rank)
            if content.get("status") == "ok":
                outcome.status = OK
            elif content.get("status") == "aborted" or (
                content.get("ename") == NOT_STARTED and rank in self._abort_sent
            ):
                outcome.status, outcome.note = RELEASED, f"not run: {self.cause or 'aborted'}"
            else:
                outcome.ename = content.get("ename", "Error")
                outcome.evalue = content.get("evalue", "")
                if outcome.ename == "BdbQuit" and not outcome.evalue:
                    outcome.evalue = "pdb was quit (q): the cell stopped there"
                outcome.traceback = list(content.get("traceback") or [])
                stopped = rank in self._abort_sent or any(o.status == DIED for o in self.outcomes.values())
                released = is_release_error(outcome.ename, outcome.evalue, stopped)
                outcome.status = RELEASED if released else ERROR
        if outcome.status == ERROR:
            with self._lock:
                if self.first_error is None:
                    self.first_error = rank
            self._fail(f"rank {rank} raised {outcome.ename}: {outcome.evalue}".rstrip(": "))
        elif outcome.ename == "PeerError":
            self._peer_silent(outcome.evalue)
        self._maybe_end(rank)

    def _peer_silent(self, evalue: str) -> None:
        """A peer's host stopped answering: nothing will come from it, so the run gives up on it
        after the release deadline, like a rank that does not stop."""
        m = _SILENT_PEER.search(evalue)
        silent = int(m.group(1)) if m else -1
        if silent not in self.outcomes or self.outcomes[silent].status != RUNNING:
            return
        with self._lock:
            self._silent.add(silent)
        self._fail(f"rank {silent} on {self._host(silent)} stopped responding (its host is down or the network is cut)")

    def _host(self, rank: int) -> str:
        try:
            return str(self.cluster.rank_infos()[rank].host)
        except Exception:
            return "its host"

    def _on_idle(self, rank: int, fut: Any = None) -> None:
        with self._lock:
            self._idle.add(rank)
        self._maybe_end(rank)

    def rank_died(self, rank: int, returncode: Optional[int]) -> None:
        """Called by the cluster when a rank's process ended (any thread)."""
        outcome = self.outcomes.get(rank)
        if outcome is None:
            return
        with self._lock:
            if rank in self._ended:
                return
            outcome.status = DIED
            outcome.note = f"process died ({describe_exit(returncode)}); {self.cluster.restart_advice}"
            self._replied.add(rank)
            self._idle.add(rank)
        why = self.cluster.death_note(rank)   # Slurm's reason, if it ended the rank
        self._fail(f"rank {rank} died ({describe_exit(returncode)})" + (f": {why}" if why else ""))
        self._maybe_end(rank)

    def _maybe_end(self, rank: int) -> None:
        with self._lock:
            if rank in self._ended or rank not in self._replied or rank not in self._idle:
                return
            self._ended.add(rank)
            all_done = len(self._ended) == len(self.ranks)
        if all_done:
            self.events.put(Event("end", rank))
            self._finish()
        else:  # nothing to show before the others end, or before the reader's next look
            self.events.put_quiet(Event("end", rank))

    # ------------------------------------------------------------ aborting

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self.cause is None:
                self.cause = reason
            cause = self.cause
        self._abort_running(f"{cause}")

    def interrupt(self, reason: str = "interrupted by the user", agreed: bool = False) -> None:
        """Stop every rank still running this cell (any thread). ``agreed``: they were told where to stop
        (an agreed stop): count their KeyboardInterrupt as a release, and send nothing yet."""
        with self._lock:
            if self.cause is None:
                self.cause = reason
            if agreed:
                now = time.monotonic()
                for r in self.ranks:
                    if r not in self._ended and r not in self._abort_sent:
                        self._abort_sent[r] = now
                        self._agreed.add(r)
                return
            # stopped again after every rank got its abort: the drain waits for no evaluation to finish
            again = bool(self._abort_sent) and not self._agreed and all(
                r in self._abort_sent for r in self.ranks if r not in self._ended)
        if again:
            self.cluster.insist_drain()
        self._abort_running(reason)

    def _abort_running(self, reason: str) -> None:
        with self._lock:
            targets = [   # a rank told where to stop (agreed) and not stopped yet gets its abort now
                r for r in self.ranks if r not in self._ended and (r not in self._abort_sent or r in self._agreed)
                and self.outcomes[r].status == RUNNING
            ]
            first = bool(targets) and not self._drained   # one drain per run: it considers every rank
            self._drained = self._drained or first
            now = time.monotonic()
            for r in targets:
                self._abort_sent[r] = now
                self._agreed.discard(r)
        if targets:
            self.cluster.send_abort(reason, targets, self.msg_ids, drain=True)
        if first:
            self.cluster.drain(self.ranks, self.msg_ids, self.still_evaluating)

    def still_evaluating(self, ranks: Sequence[int], together: bool = False) -> None:
        """``ranks`` still finish an MLX evaluation every rank joined (the drain saw them compute, or has just
        made the calls they waited in): their release is not late yet (MLX cannot cancel an evaluation).
        ``together``: no rank has left it; the reader is told once that they stop after it."""
        now = time.monotonic()
        with self._lock:
            for r in ranks:
                if r in self._abort_sent and r not in self._ended:
                    self._abort_sent[r] = now
            tell = together and not self._told_finishing
            self._told_finishing = self._told_finishing or together
        if tell:
            self.events.put(Event("notice", -1, finishing_words(ranks)))

    def check_deadlines(self, now: Optional[float] = None) -> None:
        """Give up on ranks that did not end ``release_deadline`` s after their abort, and on every
        rank of a run through a controller that died (nothing of theirs can come back)."""
        now = time.monotonic() if now is None else now
        if self.via == "controller" and now - self._controller_looked >= CONTROLLER_LOOK:
            self._controller_looked = now
            lost = self.cluster.controller_lost()
            if lost:
                self._controller_died(lost)
        late = []
        with self._lock:
            for rank, sent in self._abort_sent.items():
                if rank not in self._ended and now - sent >= self.release_deadline:
                    outcome = self.outcomes[rank]
                    if outcome.status == RUNNING:
                        outcome.status = NO_REPLY
                        outcome.note = self._no_reply_note() if rank not in self._silent else (
                            f"lost: {self._host(rank)} stopped responding (down, or cut off); "
                            f"{self.cluster.restart_advice}")
                        if rank in self._futures:
                            self.cluster.mark_busy(rank, self._futures[rank])
                    self._replied.add(rank)
                    self._idle.add(rank)
                    late.append(rank)
        for rank in late:
            self._maybe_end(rank)

    def _controller_died(self, lost: str) -> None:
        """End every rank still running: their replies and outputs went through the dead controller."""
        with self._lock:
            self.cause = self.cause or lost
            running = [r for r in self.ranks if r not in self._ended and self.outcomes[r].status == RUNNING]
            for rank in running:
                self.outcomes[rank].status = NO_REPLY
                self.outcomes[rank].note = "unreachable: the controller its cell went through is dead"
                self._replied.add(rank)
                self._idle.add(rank)
        for rank in running:
            self._maybe_end(rank)

    def _no_reply_note(self) -> str:
        backend, advice, record = self.cluster.backend, self.cluster.restart_advice, backends.find(self.cluster.backend)
        if record is not None and record.abortable:
            return (f"did not stop within {self.release_deadline:g} s (busy in native code?); "
                    f"it keeps running: interrupt again, or {advice}")
        # measured with MPI: a blocked collective ignores interrupts and has no sockets we may close
        return (f"did not stop within {self.release_deadline:g} s: busy in native code, e.g. a blocked "
                f"{backend} collective, which cannot be cancelled; {advice}; a rank stuck there cannot save "
                "its variables")

    def _finish(self) -> None:
        for rank, outcome in self.outcomes.items():
            if outcome.status == RELEASED and not outcome.note.startswith("not run"):
                own = f"{outcome.ename}: {outcome.evalue}".rstrip(": ")
                outcome.note = f"stopped ({own}) because {self.cause}" if self.cause else f"stopped ({own})"
        self.cluster.run_ended(self)
        self.done.set()
        # wakes a reader that took the last end before `done` was set: it must not sleep out its poll
        self.events.put(Event(FINISHED, -1))

    # ------------------------------------------------------------ reading

    def next_event(self, timeout: float) -> Optional[Event]:
        if self.cell_server is not None and timeout > 0 and self.events.empty() and not self.done.is_set():
            # the ranks' answers are read here, by the thread waiting for them (no hand-over to wake it)
            if self.cell_server.pump(self.ranks, timeout, self.events.empty):
                timeout = 0
        try:
            return self.events.get(timeout=timeout) if timeout > 0 else self.events.get_nowait()
        except queue.Empty:
            return None

    def world_closed(self, timeout: float = 1.0) -> dict[int, str]:
        """Rank -> why its MLX world sockets were closed, for the ranks where they were (asks the live ranks)."""
        return {row["rank"]: row["world_closed"] for row in self.cluster.status(timeout) if row.get("world_closed")}

    def display(self, mode: str = "grouped", timeout: Optional[float] = None) -> "CellRun":
        """Show this run's output (blocks until it ends); see :func:`mlx_jupyter.cluster.cells.display.show_run`."""
        from mlx_jupyter.cluster.cells.display import show_run

        return show_run(self, mode, timeout)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the run to end; True if it did."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.done.wait(0.05):
            self.check_deadlines()
            if end is not None and time.monotonic() > end:
                return False
        return True

    def __repr__(self) -> str:
        from mlx_jupyter.cluster.cells.text import rank_label

        if not self.done.is_set():
            state = "running"
        else:
            bad = [r for r, o in self.outcomes.items() if o.status != OK]
            state = f"ended, {rank_label(bad)} failed" if bad else "ended ok"
        return (f"<CellRun on {rank_label(self.ranks)}: {state}; "
                ".display() shows its output, .wait(timeout), .interrupt()>")

    @property
    def failed(self) -> bool:
        return any(o.status != OK for o in self.outcomes.values())

    @property
    def aborted_ranks(self) -> list[int]:
        return sorted(self._abort_sent)
