"""Stopping a launch: signals to the ranks, the teardown, and the cleanup of what it left on the hosts."""

from __future__ import annotations

import asyncio
import signal as _signal
from typing import TYPE_CHECKING, Awaitable, Callable, Optional, Sequence

from mlx_jupyter.launch.connections import HostConnections
from mlx_jupyter.launch.monitor import RankMonitor
from mlx_jupyter.vocab.rankinfo import KILLED, RUNNING
from mlx_jupyter.launch.remote import RemoteProcess

if TYPE_CHECKING:
    from asyncssh import SSHClientConnection


class Teardown:
    """Signals and stops the ranks ``monitor`` follows: local ones directly, remote ones through the
    watchdogs of ``connections``; SIGKILL ``grace`` s after SIGTERM."""

    def __init__(self, monitor: RankMonitor, connections: HostConnections, grace: float,
                 log: Callable[[str], None] = lambda _: None) -> None:
        self.monitor, self.connections, self.grace, self.log = monitor, connections, grace, log

    async def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """Send ``sig`` to the process groups of ``ranks`` (default: all running ranks)."""
        m = self.monitor
        targets = list(m.procs) if ranks is None else ranks
        await self._signal([r for r in targets if r in m.procs and m.ranks[r].state == RUNNING], sig)

    async def _signal(self, ranks: Sequence[int], sig: int) -> None:
        """Local ranks directly; remote ones with one line to each connection's watchdog."""
        groups: dict[SSHClientConnection, list[int]] = {}
        local: list[Awaitable[None]] = []
        for r in ranks:
            proc = self.monitor.procs[r]
            if isinstance(proc, RemoteProcess):
                groups.setdefault(proc.conn, []).append(proc.pid)
            else:
                local.append(proc.signal(sig))
        for conn, pids in groups.items():
            self.connections.watchdogs[conn].signal(pids, sig)
        await asyncio.gather(*local)

    async def stop(self, timeout: float = 2.0) -> None:
        """SIGTERM every running rank, SIGKILL after ``grace``, wait up to ``timeout``, clean up."""
        m = self.monitor
        if not m.stopping:
            m.stopping = True
            running = [i.rank for i in m.ranks if i.state == RUNNING]
            for r in running:
                m.ranks[r].state = KILLED
            if running:
                self.log(f"terminating rank(s) {', '.join(map(str, running))}")
                # don't wait for delivery: a host that went silent must not delay the others' KILL
                sends = [asyncio.ensure_future(self.signal_killed(_signal.SIGTERM, running))]
                if not await m.wait_ended(min(self.grace, timeout)):
                    sends.append(asyncio.ensure_future(self.signal_killed(_signal.SIGKILL, running)))
                    await m.wait_ended(max(timeout - self.grace, 0.5))
                for task in sends:
                    task.cancel()
        else:
            await m.wait_ended(timeout)
        if self.connections.conns and not m.ended():
            # A host that did not answer TERM/KILL: drop its connection so its
            # ranks count as lost rather than leaving the launcher waiting.
            self.connections.drop()
            await m.wait_ended(1.0)
        await self.cleanup()

    async def signal_killed(self, sig: int, ranks: Sequence[int]) -> None:
        """Signal ranks whose state is already KILLED (being torn down)."""
        m = self.monitor
        await self._signal([r for r in ranks if r in m.procs and m.ranks[r].returncode is None], sig)

    async def cleanup(self) -> None:
        """What the launch left on the hosts (after a stop every local rank has been signalled:
        the local watchdog kills any group left)."""
        await self.connections.close(self.monitor.ended())
