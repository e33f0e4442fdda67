"""Stopping a launch: signals to the ranks, the teardown, and the cleanup of what it left on the hosts."""

from __future__ import annotations

import asyncio
import shutil
import signal as _signal
from typing import Any, Optional, Sequence

from mlx_jupyter.launch.rankinfo import KILLED, RUNNING
from mlx_jupyter.launch.remote import RemoteProcess


class Stop:
    """Part of :class:`~mlx_jupyter.launch.job.Job`: tearing it down."""

    async def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """Send ``sig`` to the process groups of ``ranks`` (default: all running ranks)."""
        targets = list(self._procs) if ranks is None else ranks
        await self._signal([r for r in targets if r in self._procs and self.ranks[r].state == RUNNING], sig)

    async def _signal(self, ranks: Sequence[int], sig: int) -> None:
        """Local ranks directly; remote ones with one line to each connection's watchdog."""
        groups: dict[Any, list[int]] = {}
        local = []
        for r in ranks:
            proc = self._procs[r]
            if isinstance(proc, RemoteProcess):
                groups.setdefault(proc.conn, []).append(proc.pid)
            else:
                local.append(proc.signal(sig))
        for conn, pids in groups.items():
            self._watchdogs[conn].signal(pids, sig)
        await asyncio.gather(*local)

    async def stop(self, timeout: float = 2.0) -> None:
        """SIGTERM every running rank, SIGKILL after ``grace``, wait up to ``timeout``, clean up."""
        if not self._stopping:
            self._stopping = True
            running = [i.rank for i in self.ranks if i.state == RUNNING]
            for r in running:
                self.ranks[r].state = KILLED
            if running:
                self.log(f"terminating rank(s) {', '.join(map(str, running))}")
                # don't wait for delivery: a host that went silent must not delay the others' KILL
                sends = [asyncio.ensure_future(self.signal_killed(_signal.SIGTERM, running))]
                if not await self._wait_done(min(self.config.grace, timeout)):
                    sends.append(asyncio.ensure_future(self.signal_killed(_signal.SIGKILL, running)))
                    await self._wait_done(max(timeout - self.config.grace, 0.5))
                for task in sends:
                    task.cancel()
        else:
            await self._wait_done(timeout)
        if self._conns and not self._done_set():
            # A host that did not answer TERM/KILL: drop its connection so its
            # ranks count as lost rather than leaving the launcher waiting.
            for conns in self._conns.values():
                for conn in conns:
                    conn.abort()
            await self._wait_done(1.0)
        await self._cleanup()

    async def signal_killed(self, sig: int, ranks: Sequence[int]) -> None:
        """Signal ranks whose state is already KILLED (being torn down)."""
        await self._signal([r for r in ranks if r in self._procs and self.ranks[r].returncode is None], sig)

    async def _cleanup(self) -> None:
        if self._done_set():
            # let each watchdog remove its dir before the connection goes (bounded: a lost host can't answer)
            dogs, self._watchdogs = list(self._watchdogs.values()), {}
            await asyncio.gather(*(dog.close() for dog in dogs))
            for conns in self._conns.values():
                for conn in conns:
                    conn.close()
            self._conns = {}
        if self._guard is not None:
            # after a stop every local rank has been signalled: the guard kills any group left
            guard, self._guard = self._guard, None
            await guard.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
