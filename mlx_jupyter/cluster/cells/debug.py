"""The notebook's end of a rank's pdb session: show what it wrote, ask its prompt.

The prompt is asked with the kernel's ``input_request`` (``input()`` inside
ipykernel) on the notebook's own thread, one session at a time: prompts from
other ranks wait in the run's event queue, in order. Where nothing can answer
(a kernel run with ``allow_stdin=False``, plain Python without a terminal) the
rank is told so, prints one line and goes on (a breakpoint continues, a
post-mortem quits): a session never hangs.
"""

from __future__ import annotations

import sys
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
    """Each rank's pdb output and prompts during one run, shown through ``write``."""

    def __init__(self, run: Any, write: Callable[[str], None], ask: Callable[[str], Optional[str]] = ask):
        self.run = run
        self.write = write
        self.ask = ask
        self.started: set[int] = set()

    def event(self, rank: int, text: str, prompt: Optional[str]) -> None:
        """One ``debug`` event: show ``text``; answer ``prompt`` (KeyboardInterrupt passes through)."""
        if rank not in self.started:
            self.started.add(rank)
            others = [r for r in self.run.ranks if r != rank]
            verb = "goes" if len(others) == 1 else "go"
            wait = (f"; {rank_label(others)} {verb} on until blocked (their collectives' "
                    "timeouts still apply)") if others else ""
            self.write(f"--- pdb on rank {rank}{wait}. q quits, c continues, the stop button interrupts ---\n")
        if text:
            self.write(text if text.endswith("\n") else text + "\n")
        if prompt is None:
            return
        line = self.ask(prompt)
        if line is None:
            self.write(f"rank {rank}: pdb cannot prompt here (no stdin: allow_stdin is off, or no terminal); "
                       "the rank goes on without it (use %mlx_debug RANK -c \"...\" for commands)\n")
        self.run.answer_debug(rank, line)
