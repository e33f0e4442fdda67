"""The notebook's end of the ranks' pdb sessions: show what they write, ask their prompts.

A prompt is asked with the kernel's ``input_request`` (``input()`` inside
ipykernel) on the notebook's own thread. One session at a time: once a rank's
pdb has prompted, other ranks' prompts are held (those ranks wait) until its
session ends (continue without breakpoints, quit, or its cell ended), then
shown in the order they came. Where nothing can answer (a kernel run with
``allow_stdin=False``, plain Python without a terminal) the rank is told so,
one line says it, and the rank goes on (a breakpoint continues, a post-mortem
quits): a session never hangs. While a prompt waits, the live table (``table``)
goes on updating from a thread of its own: the notebook's thread is in ``input()``,
and the table is what says which rank is in pdb and who waits on it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Optional

from mlx_jupyter.cluster.cells.text import rank_label


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


class DebugSessions:
    """The ranks' pdb output and prompts during one run, shown through ``write``."""

    def __init__(self, run: Any, write: Callable[[str], None], ask: Callable[[str], Optional[str]] = ask,
                 table: Any = None, period: float = 0.25):
        self.run = run
        self.write = write
        self.ask = ask
        self.table = table  # the run's live table (anything with tick()), updated while a prompt waits
        self.period = period
        self.active: Optional[int] = None  # the rank whose session has the notebook
        self.held: list[tuple[int, str, Optional[str], bool]] = []
        self.stopped = False  # the stop button was pressed: show, never prompt

    def event(self, rank: int, text: str, prompt: Optional[str], done: bool = False) -> None:
        """One ``debug`` event (KeyboardInterrupt at a prompt passes through)."""
        if self.active is not None and rank != self.active:
            self.held.append((rank, text, prompt, done))
            return
        self._show(rank, text, prompt, done)

    def rank_ended(self, rank: int) -> None:
        """``rank``'s cell ended: its session, if any, with it."""
        if self.active == rank:
            self._release()

    def _show(self, rank: int, text: str, prompt: Optional[str], done: bool) -> None:
        if self.active != rank and not done:
            self.active = rank
            others = [r for r in self.run.ranks if r != rank]
            verb = "goes" if len(others) == 1 else "go"
            wait = (f"; {rank_label(others)} {verb} on until blocked (their collectives' timeouts "
                    "still apply)") if others else ""
            self.write(f"--- pdb on rank {rank}{wait}. q quits, c continues, the stop button interrupts ---\n")
        if text:
            self.write(text if text.endswith("\n") else text + "\n")
        if done:
            self._release()
            return
        if prompt is None or self.stopped:
            return
        line = self._ask_showing_where(prompt)
        if line is None:
            self.write(f"rank {rank}: pdb cannot prompt here (no stdin: allow_stdin is off, or no terminal); "
                       "the rank goes on without it (%mlx_debug RANK -c \"...\" runs commands)\n")
        self.run.answer_debug(rank, line)

    def _ask_showing_where(self, prompt: str) -> Optional[str]:
        """``ask(prompt)``, the live table ticking meanwhile (the only one ticking it: the notebook's thread waits)."""
        if self.table is None:
            return self.ask(prompt)
        answered = threading.Event()

        def tick() -> None:
            while not answered.wait(self.period):
                try:
                    self.table.tick()
                except Exception:  # the table never fails a debug session
                    return

        ticker = threading.Thread(target=tick, name="mlx-live-table-during-pdb", daemon=True)
        ticker.start()
        try:
            return self.ask(prompt)
        finally:
            answered.set()
            ticker.join()

    def _release(self) -> None:
        """The active session ended: show the held ones, in order, until one takes the notebook."""
        self.active = None
        while self.held:
            index = next((i for i, h in enumerate(self.held) if self.active is None or h[0] == self.active), None)
            if index is None:
                return
            self._show(*self.held.pop(index))
