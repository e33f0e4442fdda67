"""What the launcher knows about one rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# Rank states, in the order a rank moves through them.
PENDING = "pending"      # planned, not spawned yet
RUNNING = "running"      # spawned, not exited
EXITED = "exited"        # exited on its own (any code)
KILLED = "killed"        # terminated by the launcher (stop, or another rank failed)
LOST = "lost"            # its host stopped answering: state unknown


@dataclass
class RankInfo:
    """One rank: its number, host, pid (on that host), state and return code.

    ``returncode`` is negative for a local rank killed by a signal, 128+N for a
    remote one (as the remote shell reports it), 255 for a lost host.
    """

    rank: int
    host: str
    pid: Optional[int] = None
    state: str = PENDING
    returncode: Optional[int] = None

    @property
    def done(self) -> bool:
        """Whether the rank has ended (exited, killed or lost)."""
        return self.state in (EXITED, KILLED, LOST)


def describe_exit(returncode: Optional[int]) -> str:
    """``-11`` -> ``"killed by SIGSEGV"``; ``3`` -> ``"exit code 3"``: the one exit text (launcher, cells)."""
    import signal as _signal

    if returncode is None:
        return "exit status unknown"
    if returncode == -_signal.SIGKILL:  # what the kernel's out-of-memory killer sends
        return "killed by SIGKILL: out of memory, or killed from outside"
    if returncode < 0:
        try:
            return f"killed by {_signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    if returncode > 128:
        try:
            return f"killed by {_signal.Signals(returncode - 128).name} (exit code {returncode})"
        except ValueError:
            pass
    return f"exit code {returncode}"


def rank_prefix(rank: int, size: int) -> str:
    """``[rank 3] ``, right-aligned to the widest rank of ``size`` (``[rank  3] `` with 12 ranks);
    empty for launcher messages (rank -1). The one prefix of every launcher output path."""
    if rank < 0:
        return ""
    return f"[rank {rank:>{len(str(max(size - 1, 0)))}}] "
