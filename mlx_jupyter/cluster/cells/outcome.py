"""How a cell ended on one rank, as its run saw it: :class:`RankOutcome` and its states."""

from __future__ import annotations

from dataclasses import dataclass, field

RUNNING = "running"      # no end seen yet
OK = "ok"
ERROR = "error"          # the rank's own code raised
RELEASED = "released"    # stopped by us because another rank failed, or interrupted
DIED = "died"            # the rank's process ended
NO_REPLY = "no-reply"    # did not stop within the deadline


@dataclass
class RankOutcome:
    """How one rank's cell ended (``status`` one of the states above), with its error and a note."""

    rank: int
    status: str = OK
    ename: str = ""
    evalue: str = ""
    traceback: list[str] = field(default_factory=list)
    note: str = ""
