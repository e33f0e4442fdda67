"""srun's output read back (pure): per-rank lines, the wrapper's start and exit reports, srun's notes.

srun runs with ``--label``: each task line comes as ``" 3: text"``; srun's own
lines (``srun: error: node2: task 1: Exited with exit code 3``) are not
labelled and go out as rank -1, like mpirun's. The wrapper's marker lines
(:mod:`.wrapper`) become ``on_start``/``on_exit`` calls instead of output; a
marker at the end of a line (the task's last stderr line had no newline) is
split off it.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Callable, Optional

from mlx_jupyter.launch.slurm.parse import SrunNote, parse_srun_line, split_label
from mlx_jupyter.launch.slurm.wrapper import MARKER

_REPORT = re.compile(re.escape(MARKER) + r"-(?:start (\S+) (\d+)|exit (\d+))$")


class StepOutput:
    """Lines of srun's stdout and stderr in; ``emit(rank, stream, text)``, ``on_start(rank, step, pid)``,
    ``on_exit(rank, code)`` out. ``notes`` collects what srun and slurmstepd said about the step's end."""

    def __init__(self, size: int, emit: Callable[[int, str, str], None],
                 on_start: Callable[[int, str, int], None], on_exit: Callable[[int, int], None]):
        self.size = size
        self._emit, self._on_start, self._on_exit = emit, on_start, on_exit
        self.notes: list[SrunNote] = []
        self.own: deque[str] = deque(maxlen=6)   # srun's last lines of its own, for error messages

    def line(self, stream: str, text: str) -> None:
        """One line of srun's ``stream`` ("stdout" or "stderr"), without its newline."""
        labelled = split_label(text)
        if labelled is None or not 0 <= labelled[0] < self.size:
            self._note(text)
            if text.strip():
                self.own.append(text.strip())
            self._emit(-1, stream, text)
            return
        rank, rest = labelled
        if stream == "stderr" and self._report(rank, rest):
            return
        self._note(rest)   # slurmstepd writes "*** STEP ... CANCELLED ... ***" into the tasks' stderr
        self._emit(rank, stream, rest)

    def _report(self, rank: int, text: str) -> bool:
        at = text.rfind(MARKER)
        if at < 0:
            return False
        m = _REPORT.match(text, at)
        if m is None:
            return False
        if at > 0:
            self._emit(rank, "stderr", text[:at])
        if m.group(3) is not None:
            self._on_exit(rank, min(int(m.group(3)), 255))
        else:
            self._on_start(rank, m.group(1), int(m.group(2)))
        return True

    def _note(self, text: str) -> None:
        note: Optional[SrunNote] = parse_srun_line(text)
        if note is not None:
            self.notes.append(note)
