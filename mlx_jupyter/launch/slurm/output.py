"""srun's output read back (pure): per-rank lines, the wrapper's start and exit reports, srun's notes.

srun runs with ``--label``: each task line comes as ``" 3: text"``; srun's own
lines (``srun: error: node2: task 1: Exited with exit code 3``) are not
labelled and go out as rank -1, like mpirun's. The wrapper's marker lines
(:mod:`.wrapper`) become ``on_start``/``on_exit`` calls instead of output; a
marker at the end of a line (the task's last stderr line had no newline) is
split off it. A line the rank-side framer (:mod:`.framer`) wrote is a piece of the rank's own output,
escaped: it goes out as that piece, ending its line only where the rank wrote a newline, so a reply
streamed token by token shows as it comes.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Callable, Optional

from mlx_jupyter.launch.slurm.parse import SrunNote, parse_srun_line, split_label
from mlx_jupyter.launch.slurm.framer import FRAME
from mlx_jupyter.launch.slurm.wrapper import MARKER

_REPORT = re.compile(re.escape(MARKER) + r"-(?:start (\S+) (\d+)|exit (\d+))$")
_FRAME = FRAME.decode()
_ESCAPED = re.compile(r"\\(.)")
_UNESCAPE = {"n": "\n", "r": "\r", "\\": "\\"}


def unframe(text: str) -> list[tuple[str, bool]]:
    """A framed line's piece of output as (text, ends its line) parts: one per line it ends, then what is left."""
    data = _ESCAPED.sub(lambda m: _UNESCAPE.get(m.group(1), m.group(0)), text[len(_FRAME):])
    *lines, rest = data.split("\n")
    parts = [(line.removesuffix("\r"), True) for line in lines]
    return parts + [(rest, False)] if rest else parts


class StepOutput:
    """Lines of srun's stdout and stderr in; ``emit(rank, stream, text, ends_line)``, ``on_start(rank, step, pid)``,
    ``on_exit(rank, code)`` out. ``notes`` collects what srun and slurmstepd said about the step's end."""

    def __init__(self, size: int, emit: Callable[[int, str, str, bool], None],
                 on_start: Callable[[int, str, int], None], on_exit: Callable[[int, int], None]):
        self.size = size
        self._emit, self._on_start, self._on_exit = emit, on_start, on_exit
        self.notes: list[SrunNote] = []
        self.own: deque[str] = deque(maxlen=6)   # srun's last lines of its own, for error messages
        self.open: set[tuple[int, str]] = set()   # (rank, stream) whose line came in part so far

    def line(self, stream: str, text: str) -> None:
        """One line of srun's ``stream`` ("stdout" or "stderr"), without its newline."""
        labelled = split_label(text)
        if labelled is None or not 0 <= labelled[0] < self.size:
            self._note(text)
            if text.strip():
                self.own.append(text.strip())
            self._emit(-1, stream, text, True)
            return
        rank, rest = labelled
        if rest.startswith(_FRAME):   # the rank's own output, a piece as it came
            for part, ends in unframe(rest):
                self._emit(rank, stream, part, ends)
                (self.open.discard if ends else self.open.add)((rank, stream))
            return
        if stream == "stderr" and self._report(rank, rest):
            return
        self._note(rest)   # slurmstepd writes "*** STEP ... CANCELLED ... ***" into the tasks' stderr
        self._emit(rank, stream, rest, True)

    def _report(self, rank: int, text: str) -> bool:
        at = text.rfind(MARKER)
        if at < 0:
            return False
        m = _REPORT.match(text, at)
        if m is None:
            return False
        if at > 0:
            self._emit(rank, "stderr", text[:at], True)
        if m.group(3) is not None:
            self.end_lines(rank)
            self._on_exit(rank, min(int(m.group(3)), 255))
        else:
            self._on_start(rank, m.group(1), int(m.group(2)))
        return True

    def end_lines(self, rank: Optional[int] = None) -> None:
        """End the lines ``rank`` (None: every rank) left open: its last output had no newline, and it ended."""
        for key in sorted(k for k in self.open if rank is None or k[0] == rank):
            self.open.discard(key)
            self._emit(key[0], key[1], "", True)

    def _note(self, text: str) -> None:
        note: Optional[SrunNote] = parse_srun_line(text)
        if note is not None:
            self.notes.append(note)
