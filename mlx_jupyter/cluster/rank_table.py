"""What the notebook knows about a cluster's ranks: how many, which died and how, which are still
busy with a request that did not stop, and who wants to hear of a death."""

from __future__ import annotations

import threading
from typing import Callable, Iterable, Mapping, Optional, Protocol, Sequence

from mlx_jupyter.cluster.cells.text import describe_exit, rank_label
from mlx_jupyter.cluster.shared.errors import ClusterError

ExitCallback = Callable[[int, Optional[int]], None]


class Request(Protocol):
    """A request a rank may still be running: anything that says whether it is done."""

    def done(self) -> bool: ...


class RankTable:
    """Ranks ``0..size-1``, with the dead (rank -> return code) and the busy (rank -> its request).

    ``output()`` gives each rank's last lines of process output (engine logs, native stderr),
    which the messages about dead or missing ranks end with.
    """

    def __init__(self, output: Callable[[], Mapping[int, Sequence[str]]] = dict) -> None:
        self.size = 0
        self.dead: dict[int, Optional[int]] = {}
        self.busy: dict[int, Request] = {}
        #: an abort was sent, or a cell failed, since the ranks' namespaces were last looked at
        self.unsettled = False
        self.changed = threading.Event()  # set at every death: a wait for the ranks looks again
        #: why no rank runs although the table has ranks (a restart stopped them and did not finish), or ""
        self.not_running = ""
        self.exit_callbacks: list[ExitCallback] = []
        self._output = output

    @property
    def ranks(self) -> list[int]:
        return list(range(self.size))

    def reset(self, size: int) -> None:
        """A fresh set of ``size`` ranks: none dead, none busy."""
        self.size = size
        self.dead.clear()
        self.busy.clear()
        self.unsettled = False
        self.not_running = ""

    def died(self, rank: int, returncode: Optional[int]) -> None:
        """``rank``'s process ended (any thread): a wait for the ranks looks again."""
        self.dead[rank] = returncode
        self.changed.set()

    def announce_exit(self, rank: int, returncode: Optional[int]) -> None:
        """Tell the exit callbacks that ``rank`` ended (a failing callback is skipped)."""
        for cb in list(self.exit_callbacks):
            try:
                cb(rank, returncode)
            except Exception:
                pass

    def check(self, ranks: Sequence[int], restart_advice: str) -> None:
        """Raise a clear error if one of ``ranks`` is dead or still busy with an earlier request."""
        if self.not_running:
            raise ClusterError(f"the ranks are not running: {self.not_running}\n{restart_advice}")
        if any(r in self.dead for r in ranks):
            raise ClusterError(self.dead_message("is dead") + f"\n{restart_advice}")
        busy = [r for r in ranks if r in self.busy and not self.busy[r].done()]
        if busy:
            raise ClusterError(f"{rank_label(busy)} still running an earlier cell that did not stop; "
                               f"interrupt it, or {restart_advice}")
        for r in ranks:
            self.busy.pop(r, None)

    def dead_message(self, what: str, tail: bool = False) -> str:
        """One line per dead rank (``rank 1 <what>: killed by SIGKILL``), then their last output."""
        lines = [f"rank {r} {what}: {describe_exit(rc)}" for r, rc in sorted(self.dead.items())]
        if tail:
            lines.append(self.tail(sorted(self.dead)))
        return "\n".join(line for line in lines if line)

    def tail(self, ranks: Iterable[int], n: int = 15) -> str:
        """The last ``n`` lines of output of ``ranks``, and of the launcher itself (rank -1: mpirun)."""
        try:
            out = self._output()
        except Exception:
            return ""
        parts = []
        for r in ranks:
            lines = list(out.get(r, []))[-n:]
            if lines:
                parts.append(f"last output of rank {r}:\n  " + "\n  ".join(lines))
        job = list(out.get(-1, []))[-n:]
        if job:
            parts.append("last output of the launcher:\n  " + "\n  ".join(job))
        return "\n".join(parts)
