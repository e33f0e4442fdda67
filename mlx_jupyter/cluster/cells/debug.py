"""The notebook's end of the ranks' pdb sessions: one prompt for every rank at a pdb prompt (lockstep).

A prompt is asked with the kernel's ``input_request`` (``input()`` inside
ipykernel) on the notebook's own thread. The ranks of a cell that stop in pdb
(``breakpoint()`` on every rank, ``%mlx_debug --all``) share ONE prompt: the
first prompt waits up to ``gather`` s for the cell's other running ranks to
stop too; a line then goes to every rank at the prompt at once, and what they
answer is shown grouped as cell output is (``[ranks 0-2] 3.0`` /
``[rank 3] nan``). ``rank 2 p x`` (``ranks 0,2-3 p x``: any rank list)
talks to some of them; a command that moves a rank (``n``, ``s``, ``c``,
``r``, ``unt``, ``j``) goes to every rank or to none, so that no rank runs
alone into a collective whose peers sit at the prompt. A rank that stops later
joins at the next prompt. Where nothing can answer (a kernel run with
``allow_stdin=False``, plain Python without a terminal) the ranks are told so,
one line says it, and they go on (a breakpoint continues, a post-mortem quits):
a session never hangs. While a prompt waits, the live table (``table``) goes on
updating from a thread of its own. A cell that went through the controller (a
connected notebook's) has no cell channel: :class:`ControlDebugLink` asks its ranks
for their pdb's output and sends them their lines on the control channel
(``mlx_debug_request``, see :class:`mlx_jupyter.cluster.rank.debug_control.ControlPort`).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from functools import partial
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from mlx_jupyter.cluster.cells.targets import TargetsError, parse_targets
from mlx_jupyter.cluster.cells.text import LineGrouper, rank_label


class ControlSender(Protocol):
    """The link to the ranks' control channels (the controller's)."""

    def send_control(self, rank: int, msg_type: str, content: dict[str, Any]) -> Any: ...  # a future of the reply


class ControlHost(Protocol):
    """A run's cluster, as far as its pdb sessions reach it."""

    @property
    def link(self) -> ControlSender: ...


class DebuggedRun(Protocol):
    """What the pdb sessions read of a cell run (:class:`~.run.CellRun` is one)."""

    @property
    def ranks(self) -> Sequence[int]: ...
    @property
    def started(self) -> float: ...  # time.monotonic() of its start
    @property
    def via(self) -> str: ...  # "controller": its ranks' pdbs are asked on the control channel
    @property
    def msg_ids(self) -> Mapping[int, str]: ...  # rank -> the id of its cell
    @property
    def cluster(self) -> ControlHost: ...
    def channel_debug(self, rank: int, text: str, prompt: Optional[str], done: bool = False) -> None: ...
    def answer_debug(self, rank: int, line: Optional[str]) -> None: ...


def can_prompt() -> bool:
    """True where ``input()`` reaches a person: an IPython kernel (it may still refuse) or a terminal."""
    try:
        from IPython import get_ipython

        if getattr(get_ipython(), "kernel", None) is not None:
            return True
    except ImportError:
        pass
    return bool(getattr(sys.stdin, "isatty", lambda: False)())


def ask(prompt: str) -> Optional[str]:
    """A line typed at ``prompt``, or None when this front end cannot prompt."""
    if not can_prompt():
        return None
    try:
        return input(prompt)
    except EOFError:
        return "q"
    except Exception as exc:  # ipykernel's StdinNotImplementedError: allow_stdin is off
        if type(exc).__name__ == "StdinNotImplementedError":
            return None
        raise


#: ``rank 2 p x``, ``ranks 0,2-3 where``: a line for some ranks only
TARGETED = re.compile(r"^\s*ranks?\s+([0-9][0-9,\-]*)(?:\s+(.*))?$", re.S)
#: a cell's file as each rank's kernel names it (its pid in the folder): the same cell on every rank
CELL_FILE = re.compile(r"\S*ipykernel_\d+/\d+\.py")
#: pdb commands that let a rank run on (it may then enter a collective) or end it: all ranks or none
MOVES = frozenset(("n", "next", "s", "step", "c", "cont", "continue", "r", "return", "unt", "until", "j", "jump",
                   "q", "quit", "exit"))


def split_targets(line: str, size: int) -> tuple[Optional[list[int]], str]:
    """``"rank 2 p x"`` -> ([2], "p x"); ``"p x"`` -> (None, "p x"). ValueError names a bad rank list."""
    m = TARGETED.match(line)
    if m is None:
        return None, line
    try:
        ranks = parse_targets(m.group(1), size, flag="rank")
    except TargetsError:
        raise
    except ValueError:
        raise ValueError(f"cannot read the ranks {m.group(1)!r}: write them as 2, 0,2 or 0-3 (no spaces)") from None
    return ranks, (m.group(2) or "").strip()


class ControlDebugLink:
    """The pdb sessions of a run through the controller: from ``start`` s into the cell, every ``period`` s,
    each running rank is asked (``mlx_debug_request``) for what its pdb wrote since; the answers become the
    run's ``debug`` events, as the cell channel's do. Lines go to the ranks the same way."""

    def __init__(self, run: DebuggedRun, send_control: Callable[[int, str, dict[str, Any]], Any], period: float = 0.2,
                 start: float = 0.25):
        self.run = run
        self.send_control = send_control
        self.period = period
        self.next = run.started + start
        self.asking: set[int] = set()  # ranks whose last request is unanswered: not asked again meanwhile
        self._lock = threading.Lock()

    def poll(self, ended: set[int]) -> None:
        """Ask every running rank not being asked, if it is time (the notebook's thread)."""
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + self.period
        for rank in self.run.ranks:
            with self._lock:
                if rank in ended or rank in self.asking or rank not in self.run.msg_ids:
                    continue
                self.asking.add(rank)
            self._request(rank, {})

    def send_line(self, rank: int, line: Optional[str]) -> None:
        """``rank``'s pdb's next line (None: this front end cannot prompt)."""
        self._request(rank, {"line": line})

    def _request(self, rank: int, extra: dict[str, Any]) -> None:
        try:
            fut = self.send_control(rank, "mlx_debug_request", {"cell": self.run.msg_ids[rank], **extra})
        except Exception:  # the controller is gone: the run ends by itself, with its own error
            with self._lock:
                self.asking.discard(rank)
            return
        fut.add_done_callback(partial(self._answered, rank, not extra))

    def _answered(self, rank: int, poll: bool, fut: Any) -> None:
        """A rank's reply (the client's I/O thread): its pdb's messages, as debug events."""
        if poll:
            with self._lock:
                self.asking.discard(rank)
        try:
            msgs = fut.result()["content"].get("msgs") or []
        except Exception:
            return
        for msg in msgs:
            prompt = msg.get("prompt")
            self.run.channel_debug(rank, str(msg.get("text") or ""), None if prompt is None else str(prompt),
                                   bool(msg.get("done")))


def control_link(run: DebuggedRun) -> Optional[ControlDebugLink]:
    """A :class:`ControlDebugLink` for ``run`` when it went through the controller, else None."""
    if run.via != "controller":
        return None
    return ControlDebugLink(run, run.cluster.link.send_control)


class Ticking(Protocol):
    """The run's live table, as a waiting prompt keeps it going."""

    def tick(self) -> None: ...


class DebugSessions:
    """The ranks' pdb output and prompts during one run, shown through ``write``, one prompt for them all."""

    def __init__(self, run: DebuggedRun, write: Callable[[str], None], ask: Callable[[str], Optional[str]] = ask,
                 table: Optional[Ticking] = None, period: float = 0.25, gather: float = 1.0, settle: float = 5.0):
        self.run = run
        self.write = write
        self.ask = ask
        self.table = table  # the run's live table (anything with tick()), updated while a prompt waits
        self.period = period
        self.gather = gather  # how long a new session's first prompt waits for the cell's other ranks to stop (s)
        self.settle = settle  # how long the prompt waits for the ranks sent a line to answer (s)
        self.prompts: dict[int, str] = {}  # the ranks at a pdb prompt, not yet sent a line
        self.texts: dict[int, str] = {}  # what each rank's pdb wrote since it was last shown
        self.sent: set[int] = set()  # ranks sent a line that have not prompted again (nor ended)
        self.since = 0.0  # when the oldest unasked prompt came, or the last line was sent
        self.ended: set[int] = set()
        self.members: set[int] = set()  # the ranks shown in the session's header
        self.unanswerable = False  # the front end cannot prompt: every prompt is answered None
        self.stopped = False  # the stop button was pressed: show, never prompt
        self.link = control_link(run)  # a run through the controller: its ranks' pdbs are asked for

    # ------------------------------------------------------------ events (the notebook's thread)

    def event(self, rank: int, text: str, prompt: Optional[str], done: bool = False) -> None:
        """One ``debug`` event (KeyboardInterrupt at a prompt passes through)."""
        if text:
            self.texts[rank] = self.texts.get(rank, "") + text
        if done or prompt is not None:
            self.sent.discard(rank)
        if done:
            self.prompts.pop(rank, None)
            self.members.discard(rank)
        elif prompt is not None:
            if not self.prompts and not self.sent and not self.members:
                self.since = time.monotonic()  # a new session: wait a moment for the others to stop too
            self.prompts[rank] = prompt
        self._advance()

    def rank_ended(self, rank: int) -> None:
        """``rank``'s cell ended: its session, if any, with it."""
        self.ended.add(rank)
        self.members.discard(rank)
        self.prompts.pop(rank, None)
        self.sent.discard(rank)
        self._advance()

    def tick(self) -> None:
        """Called while the run is shown: a prompt whose wait for the other ranks is over is asked."""
        if self.link is not None:
            self.link.poll(self.ended)
        if self.prompts or self.texts:
            self._advance()

    # ------------------------------------------------------------ the prompt

    def _running(self) -> list[int]:
        return [r for r in self.run.ranks if r not in self.ended]

    def _ready(self) -> bool:
        """Every rank sent a line answered (or ``settle`` s passed); a new session: every running rank
        stopped (or ``gather`` s passed)."""
        if not self.prompts:
            return False
        waited = time.monotonic() - self.since
        if self.sent:
            return waited >= self.settle
        if self.members or self.unanswerable or self.stopped:
            return True
        return waited >= self.gather or all(r in self.prompts for r in self._running())

    def _advance(self) -> None:
        if not self._ready():
            if not self.prompts and not self.sent:
                self._show_texts()  # a session's last words (done, ended): nothing will prompt for them
            return
        here = sorted(self.prompts)
        new = set(here) - self.members
        if new:
            self.members |= new
            self._header(here)
        self._show_texts()
        if self.stopped:
            return
        if self.sent:
            late = sorted(self.sent)
            self.write(f"({rank_label(late)} still {'runs' if len(late) == 1 else 'run'} the last command after "
                       f"{self.settle:g} s; {'it joins' if len(late) == 1 else 'they join'} the prompt when stopped)\n")
        while self.prompts:
            here = sorted(self.prompts)
            line = None if self.unanswerable else self._ask_showing_where(self._prompt(here))
            if line is None:
                if not self.unanswerable:
                    self.write(f"{rank_label(here)}: pdb cannot prompt here (no stdin: allow_stdin is off, or no "
                               "terminal); the ranks go on without it (%mlx_debug RANK -c \"...\" runs commands)\n")
                self.unanswerable = True
                self._send(here, None)
                return
            targets = self._targets(line, here)
            if targets is not None:
                self._send(*targets)
                return

    def _header(self, here: list[int]) -> None:
        others = [r for r in self._running() if r not in self.members]
        verb = "goes" if len(others) == 1 else "go"
        wait = (f"; {rank_label(others)} {verb} on until blocked (their collectives' timeouts "
                "still apply)") if others else ""
        if len(here) == 1 and len(self.members) == 1:
            self.write(f"--- pdb on rank {here[0]}{wait}. q quits, c continues, the stop button interrupts ---\n")
        else:
            self.write(f"--- pdb on {rank_label(here)} together{wait}. A command goes to every rank at the prompt, "
                       "'rank N cmd' to one; q quits all, c continues all, the stop button interrupts ---\n")

    def _prompt(self, here: list[int]) -> str:
        return self.prompts[here[0]] if len(here) == 1 else f"(Pdb {rank_label(here)}) "

    def _targets(self, line: str, here: list[int]) -> Optional[tuple[list[int], str]]:
        """The ranks ``line`` goes to and the command they get (None: refused, said why; ask again)."""
        try:
            ranks, command = split_targets(line, max(self.run.ranks) + 1)
        except ValueError as exc:
            self.write(f"{exc} (at the prompt: {rank_label(here)})\n")
            return None
        if ranks is None:
            return here, line
        if not command:
            self.write(f"{line.strip()} what? Write the command after the ranks, e.g. "
                       f"'rank {ranks[0]} p loss'\n")
            return None
        away = [r for r in ranks if r not in self.prompts]
        if away:
            self.write(f"{rank_label(away)} {'is' if len(away) == 1 else 'are'} not at the prompt "
                       f"(the ranks at it: {rank_label(here)})\n")
            return None
        if command.split()[0] in MOVES and len(ranks) < len(here):
            self.write(f"'{command.split()[0]}' moves ranks: it goes to every rank at the prompt or none (one rank "
                       "running on alone may wait in a collective on ranks held at the prompt); "
                       f"write '{command}' without 'rank'\n")
            return None
        return ranks, command

    def _send(self, ranks: list[int], line: Optional[str]) -> None:
        self.sent = set()  # a rank still running an earlier line is waited for no more: it joins when it stops
        for rank in ranks:
            self.prompts.pop(rank, None)
            self.sent.add(rank)
            if self.link is not None:
                self.link.send_line(rank, line)
            else:
                self.run.answer_debug(rank, line)
        self.since = time.monotonic()

    def _show_texts(self) -> None:
        """What the ranks' pdbs wrote, grouped as cell output is; unlabelled when one rank is in the session."""
        texts = {r: t for r, t in self.texts.items() if t}
        self.texts = {}
        if not texts:
            return
        if len(self.members | set(texts)) <= 1:
            text = next(iter(texts.values()))
            self.write(text if text.endswith("\n") else text + "\n")
            return
        grouper = LineGrouper(sorted(texts))
        for rank, text in texts.items():
            grouper.feed(rank, CELL_FILE.sub("<cell>", text))
            grouper.finish(rank)
        self.write("".join(f"[{rank_label(ranks)}] {line}\n" for ranks, line in grouper.flush(force=True)))

    def _ask_showing_where(self, prompt: str) -> Optional[str]:
        """``ask(prompt)``, the live table ticking meanwhile (the only one ticking it: the notebook's thread waits)."""
        table = self.table
        if table is None:
            return self.ask(prompt)
        answered = threading.Event()

        def tick() -> None:
            while not answered.wait(self.period):
                try:
                    table.tick()
                except Exception:  # the table never fails a debug session
                    return

        ticker = threading.Thread(target=tick, name="mlx-live-table-during-pdb", daemon=True)
        ticker.start()
        try:
            return self.ask(prompt)
        finally:
            answered.set()
            ticker.join()
