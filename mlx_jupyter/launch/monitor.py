"""Watching a launch's ranks: their output, their exits, failing fast, and the summary of how it ended."""

from __future__ import annotations

import asyncio
import sys
from typing import Callable, Optional, Union

from mlx_jupyter.launch import mpi
from mlx_jupyter.launch.contract import MPIPlan
from mlx_jupyter.launch.launch_config import LaunchConfig, interpreter_of
from mlx_jupyter.launch.local import LocalProcess
from mlx_jupyter.launch.rank_output import RankOutput
from mlx_jupyter.vocab.rankinfo import EXITED, KILLED, LOST, RankInfo, describe_exit
from mlx_jupyter.launch.remote import RemoteProcess
from mlx_jupyter.launch.streams import EndingNoise
from mlx_jupyter.launch.where_ask import WhereAnswers

#: one rank's process (with mpi: mpirun's)
RankProcess = Union[LocalProcess, RemoteProcess]

#: how Python starts the line that names a module a rank could not import
MISSING_MODULE = "ModuleNotFoundError: "


class RankMonitor:
    """The ranks of one launch while they run (``ranks``, ``size`` of them; with mpi, mpirun is the one
    process). ``config`` gives the output and exit callbacks and the failure rule; ``on_failure()`` is
    called when a rank fails and the launch is to end (``terminate_on_failure``). ``local[r]``: rank r
    runs on this machine."""

    def __init__(self, config: LaunchConfig, ranks: list[RankInfo], size: int,
                 on_failure: Callable[[], None] = lambda: None, local: Optional[list[bool]] = None) -> None:
        self.config, self.ranks, self.size, self.on_failure = config, ranks, size, on_failure
        self.local = local if local is not None else [False] * len(ranks)
        self.argv: list[str] = []             # what every rank runs, once known
        self.missing_modules: dict[int, str] = {}   # rank -> "No module named 'x'" from its stderr
        self.procs: dict[int, RankProcess] = {}
        self.failures: list[int] = []         # ranks in the order they failed
        self.stopping = False                 # the launch is being torn down: exits are expected
        self.done: Optional[asyncio.Event] = None
        self.watchers: list[asyncio.Task[None]] = []   # held: the loop keeps only weak references to tasks
        self.reaped = 0
        self.mpi_plan: Optional[MPIPlan] = None
        self.mpi_output: Optional[mpi.TaggedOutput] = None
        self.where = WhereAnswers()           # the ranks' answers to SIGUSR1 (--where-on-signal)
        self.noise = EndingNoise()            # MLX's ring errors, CPython's exit dump: one line at a rank's end
        self.output = RankOutput(config, lambda: self.size)
        self._midline: set[tuple[int, str]] = set()   # (rank, stream) whose line came in part so far
        self._held: set[tuple[int, str]] = set()      # ... and whose first part a filter took: the rest goes too

    def begin(self) -> None:
        """Start of the launch (on its loop): the event that is set once every rank has ended."""
        self.done = asyncio.Event()

    def emit(self, rank: int, stream: str, text: str, ends: bool = True) -> None:
        """Text of a rank's output (``ends``: it ends its line) to :class:`RankOutput`; a line's start is
        looked at first (where answers, missing modules, ending noise)."""
        key = (rank, stream)
        if key in self._held:
            if ends:
                self._held.discard(key)
            return
        if key not in self._midline and self._taken(rank, stream, text):
            if not ends:
                self._held.add(key)
            return
        if ends:
            self._midline.discard(key)
        else:
            self._midline.add(key)
        self.output(rank, stream, text, ends)

    def _taken(self, rank: int, stream: str, line: str) -> bool:
        """Whether ``line`` (or a line's start) is kept here rather than shown."""
        if self.where.line(rank, stream, line):
            return True
        if stream == "stderr" and line.startswith(MISSING_MODULE):
            self.missing_modules.setdefault(rank, line[len(MISSING_MODULE):].strip())
        return stream == "stderr" and self.noise.hold(rank, line)

    def watch(self, rank: int, proc: RankProcess) -> None:
        """Follow ``proc`` (rank ``rank``) until it exits."""
        self.procs[rank] = proc
        self.watchers.append(asyncio.ensure_future(self._watch(rank, proc)))

    async def _watch(self, rank: int, proc: RankProcess) -> None:
        code = await proc.wait()
        if self.mpi_output is not None:
            self.mpi_output.flush()
        noise = self.noise.line(rank)
        if noise is not None:
            self.output(rank, "stderr", noise)
        info = self.ranks[rank]
        info.returncode = code
        if _lost_reason(proc) is not None:
            info.state = LOST
        elif self.stopping and info.state == KILLED:
            pass
        else:
            info.state = EXITED
        if code != 0 and info.state != KILLED:
            self.failures.append(rank)
        if self.config.on_exit is not None:
            try:
                self.config.on_exit(rank, code if code is not None else -1)
            except Exception as exc:  # noqa: BLE001
                print(f"mlx-jupyter launch: on_exit callback failed: {exc!r}", file=sys.stderr)
        if code != 0 and info.state != KILLED and self.config.terminate_on_failure and not self.stopping:
            self.on_failure()
        self.reaped += 1
        self.all_watched()

    def all_watched(self) -> None:
        """Set ``done`` once every watched process has been reaped."""
        if self.reaped == len(self.procs) and self.done is not None:
            self.done.set()

    async def wait(self, timeout: Optional[float] = None) -> None:
        """Wait for every rank to end; TimeoutError after ``timeout`` s."""
        assert self.done is not None, "start() first"
        try:
            await asyncio.wait_for(self.done.wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"ranks still running after {timeout:g} s") from None

    def exit_code(self) -> int:
        """0, or the code of the first rank that failed (255 for a lost host)."""
        for r in self.failures:
            code = self.ranks[r].returncode
            return 255 if code is None else code
        return next((i.returncode for i in self.ranks if i.returncode is not None and i.returncode != 0), 0)

    def ended(self) -> bool:
        """Whether every rank has ended (or none was started)."""
        return self.done is None or self.done.is_set() or not self.procs

    async def wait_ended(self, timeout: float) -> bool:
        """Up to ``timeout`` s for every rank to end; whether they did."""
        if self.done is None or not self.procs:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self.done.wait()), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def summary(self) -> str:
        """One line naming each failed, lost or killed rank with its host and code."""
        parts = []
        if self.mpi_plan is not None and self.failures:
            return self._mpi_summary()
        for r in self.failures:
            i = self.ranks[r]
            if i.state == LOST:
                reason = _lost_reason(self.procs.get(r)) or ""
                parts.append(f"rank {r} on {i.host} lost ({reason})")
            else:
                parts.append(f"rank {r} on {i.host} {_exited(i.returncode)}{self._missing_module_note(r)}")
        killed = [i for i in self.ranks if i.state == KILLED]
        if killed:
            parts.append("terminated: " + ", ".join(f"rank {i.rank} on {i.host}" for i in killed))
        return "; ".join(parts)

    def _missing_module_note(self, rank: int) -> str:
        """`` (No module named 'mlx'; the rank ran /usr/bin/python3 ...)``: which interpreter lacked it."""
        missing = self.missing_modules.get(rank)
        if missing is None:
            return ""
        ran = interpreter_of(self.argv, self.local[rank]) if self.argv else None
        if ran is None:
            return f" ({missing})"
        hint = "" if ran == self.config.python else f"; --python is {self.config.python}"
        return f" ({missing}; the rank ran {ran}{hint})"

    def _mpi_summary(self) -> str:
        """mpirun's exit code, and the first failing rank and its host as mpirun reported them."""
        code = f"mpirun {_exited(self.ranks[0].returncode)}"
        failure = self.mpi_output.failure if self.mpi_output else None
        if failure is None:
            return code
        assert self.mpi_plan is not None
        host = failure.node
        custom = any(k in a for a in self.config.mpi_args for k in ("map-by", "rank-by", "npernode", "rankfile"))
        if host is None and not custom and failure.rank < len(self.mpi_plan.rank_hosts):
            host = self.mpi_plan.rank_hosts[failure.rank]   # Open MPI's default placement
        where = f" on {host}" if host else ""
        return f"rank {failure.rank}{where} {failure.what} (the first to fail); {code}"


def _lost_reason(proc: Optional[RankProcess]) -> Optional[str]:
    """Why a rank's host was lost (only a remote rank's can be)."""
    return proc.lost_reason if isinstance(proc, RemoteProcess) else None


def _exited(code: Optional[int]) -> str:
    """``exited with code 3``, or :func:`describe_exit`'s text for a signal or an unknown status."""
    text = describe_exit(code)
    return f"exited with code {code}" if text.startswith("exit code") else text

