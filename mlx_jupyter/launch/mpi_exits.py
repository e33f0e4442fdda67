"""Each mpirun rank's own exit status, so the launcher names the first to fail without reading mpirun's prose.

Open MPI names the first failing rank in a message it does not always print (with ranks on other
hosts, a race in mpirun leaves only "Primary job terminated normally, but 1 process returned a
non-zero exit code", which names none). So each rank's command runs under a small POSIX ``sh``
that waits for it and writes one marker line to the rank's stderr, ``<marker> <status>``, which
``--tag-output`` labels with the rank. The marker carries a fresh nonce per launch; the parser
hides it from the rank's output.
"""

from __future__ import annotations

import re
import secrets
import signal
from dataclasses import dataclass
from typing import Optional, Sequence

#: signals the waiting shell survives (mpirun forwards SIGUSR1/2, ``--where-on-signal`` uses SIGUSR1,
#: Ctrl-C and an abort send SIGINT/SIGTERM to the rank's process group): the rank gets them, the shell
#: stays to report the rank's status
_TRAPPED = "HUP INT QUIT TERM USR1 USR2 ALRM"

#: The shell text. The command runs through an inner ``sh -c 'exec ...'`` whose stderr the outer shell
#: sets back to the rank's: the outer shell's own stderr is /dev/null meanwhile, so its note on a
#: signalled child ("Terminated") never reaches the rank's output. A child killed by signal N
#: (status 128+N) makes the shell die of the same signal, so mpirun sees what it would have seen.
WRAPPER = (
    f"trap : {_TRAPPED}; "
    "m=$1; shift; "
    "{ /bin/sh -c 'exec 2>&3 3>&-; exec \"$@\"' \"$0\" \"$@\"; s=$?; } 3>&2 2>/dev/null; "
    "printf '%s %s\\n' \"$m\" \"$s\" >&2; "
    f"if [ \"$s\" -gt 128 ] && [ \"$s\" -lt 193 ]; then trap - {_TRAPPED}; kill -s \"$(kill -l \"$s\")\" $$; fi; "
    "exit \"$s\""
)


def new_marker() -> str:
    """A marker no rank prints by chance (not secret: it is on the command line)."""
    return f"mlx-jupyter-exit-{secrets.token_hex(8)}"


def reporting(argv: Sequence[str], marker: str) -> list[str]:
    """``argv`` run under the reporting shell (the rank's command as its arguments, never in its text)."""
    return ["/bin/sh", "-c", WRAPPER, "mlx-rank", marker, *argv]


@dataclass(frozen=True)
class RankExit:
    """One rank's exit as its shell reported it."""

    rank: int
    status: int     # the shell's $?: the exit code, or 128 + the signal that killed it

    @property
    def failed(self) -> bool:
        return self.status != 0

    @property
    def killed_by_abort(self) -> bool:
        """Ended by SIGTERM or SIGKILL: what mpirun sends the other ranks once one failed."""
        return self.status in (128 + signal.SIGTERM, 128 + signal.SIGKILL)

    def what(self) -> str:
        """``exited with code 5`` or ``was killed by signal 9 (Killed)``."""
        if 128 < self.status < 193:
            number = self.status - 128
            try:
                said = signal.strsignal(number)
            except ValueError:
                said = None
            return f"was killed by signal {number}" + (f" ({said})" if said else "")
        return f"exited with code {self.status}"


class ExitMarkers:
    """Reads the markers out of the ranks' stderr lines; keeps the exits in the order they came."""

    def __init__(self, marker: str):
        self._line = re.compile(re.escape(marker) + r" (\d{1,3})$")
        self.exits: list[RankExit] = []

    def take(self, rank: int, text: str) -> Optional[str]:
        """``text`` without a marker at its end (noting the exit), or None if it was the marker alone."""
        m = self._line.search(text)
        if m is None:
            return text
        self.exits.append(RankExit(rank, int(m.group(1))))
        return text[: m.start()] or None

    def first_failure(self) -> Optional[RankExit]:
        """The first rank to fail: the first non-zero exit not caused by the abort, else the first non-zero."""
        failed = [e for e in self.exits if e.failed]
        own = [e for e in failed if not e.killed_by_abort]
        chosen = own or failed
        return chosen[0] if chosen else None
