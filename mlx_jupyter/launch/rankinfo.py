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
