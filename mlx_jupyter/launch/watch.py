"""Watching the ranks: their output, their exits, failing fast, and the summary of how the launch ended."""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Optional

from mlx_jupyter.launch.config import interpreter_of
from mlx_jupyter.launch.rankinfo import EXITED, KILLED, LOST, describe_exit, rank_prefix

MISSING_MODULE = "ModuleNotFoundError: "


class Watch:
    """Part of :class:`~mlx_jupyter.launch.job.Job`: the ranks while they run."""

    def _emit(self, rank: int, stream: str, line: str) -> None:
        if stream == "stderr" and line.startswith(MISSING_MODULE):
            self.missing_modules.setdefault(rank, line[len(MISSING_MODULE):].strip())
        cb = self.config.on_output
        if cb is None:
            target = sys.stdout if stream == "stdout" else sys.stderr
            prefix = rank_prefix(rank, self.size) if self.size > 1 else ""
            print(prefix + line, file=target, flush=True)
            return
        try:
            cb(rank, stream, line)
        except Exception as exc:  # noqa: BLE001 - a user callback must not kill the launcher
            print(f"mlx-jupyter launch: on_output callback failed: {exc!r}", file=sys.stderr)

    async def _watch(self, rank: int, proc: Any) -> None:
        code = await proc.wait()
        if self._mpi_output is not None:
            self._mpi_output.flush()
        info = self.ranks[rank]
        info.returncode = code
        lost = getattr(proc, "lost_reason", None)
        if lost is not None:
            info.state = LOST
        elif self._stopping and info.state == KILLED:
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
        if code != 0 and info.state != KILLED and self.config.terminate_on_failure and not self._stopping:
            asyncio.ensure_future(self.stop(self.config.grace))
        self._reaped += 1
        if self._reaped == len(self._procs) and self._done is not None:
            self._done.set()

    async def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for every rank; 0 if all exited 0, else the first failing rank's code."""
        assert self._done is not None, "start() first"
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"ranks still running after {timeout:g} s") from None
        await self._cleanup()
        return self.exit_code()

    def exit_code(self) -> int:
        """0, or the code of the first rank that failed (255 for a lost host)."""
        for r in self.failures:
            code = self.ranks[r].returncode
            return 255 if code is None else code
        bad = [i for i in self.ranks if i.returncode not in (0, None)]
        return bad[0].returncode if bad else 0  # type: ignore[return-value]

    def _done_set(self) -> bool:
        return self._done is None or self._done.is_set() or not self._procs

    async def _wait_done(self, timeout: float) -> bool:
        if self._done is None or not self._procs:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._done.wait()), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def summary(self) -> str:
        """One line naming each failed, lost or killed rank with its host and code."""
        parts = []
        if self._mpi_plan is not None and self.failures:
            return self._mpi_summary()
        for r in self.failures:
            i = self.ranks[r]
            if i.state == LOST:
                reason = getattr(self._procs.get(r), "lost_reason", "")
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
        ran = interpreter_of(self.argv, self.hosts[rank].is_local) if self.argv else None
        if ran is None:
            return f" ({missing})"
        hint = "" if ran == self.config.python else f"; --python is {self.config.python}"
        return f" ({missing}; the rank ran {ran}{hint})"

    def _mpi_summary(self) -> str:
        """mpirun's exit code, and the first failing rank and its host as mpirun reported them."""
        code = f"mpirun {_exited(self.ranks[0].returncode)}"
        failure = self._mpi_output.failure if self._mpi_output else None
        if failure is None:
            return code
        assert self._mpi_plan is not None
        host = failure.node
        custom = any(k in a for a in self.config.mpi_args for k in ("map-by", "rank-by", "npernode", "rankfile"))
        if host is None and not custom and failure.rank < len(self._mpi_plan.rank_hosts):
            host = self._mpi_plan.rank_hosts[failure.rank]   # Open MPI's default placement
        where = f" on {host}" if host else ""
        return f"rank {failure.rank}{where} {failure.what} (the first to fail, says mpirun); {code}"


def _exited(code: Optional[int]) -> str:
    """``exited with code 3``, or :func:`describe_exit`'s text for a signal or an unknown status."""
    text = describe_exit(code)
    return f"exited with code {code}" if text.startswith("exit code") else text
