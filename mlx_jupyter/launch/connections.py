"""Reaching a launch's hosts: one ssh connection per remote host (more past its MaxSessions), each
with its remote watchdog; the local ranks' watchdog and the launch's local temp dir."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.local_watchdog import LocalWatchdog
from mlx_jupyter.launch.remote import RemoteWatchdog
from mlx_jupyter.net import ssh

if TYPE_CHECKING:
    from asyncssh import SSHClientConnection


class HostConnections:
    """The ssh connections to ``hosts`` (in rank order), made with ``ssh_options`` within
    ``start_timeout`` s; ``log(step)`` reports each step."""

    def __init__(self, hosts: Sequence[Host], ssh_options: Optional[ssh.SSHOptions], start_timeout: float,
                 log: Callable[[str], None] = lambda _: None) -> None:
        self.hosts, self.ssh_options, self.start_timeout, self.log = list(hosts), ssh_options, start_timeout, log
        self.conns: dict[str, list[SSHClientConnection]] = {}   # host -> connections (more than one past MaxSessions)
        self.rank_conn: dict[int, SSHClientConnection] = {}
        self.watchdogs: dict[SSHClientConnection, RemoteWatchdog] = {}   # connection -> its watchdog session
        self.local_watchdog: Optional[LocalWatchdog] = None   # owns tmpdir once started
        self.tmpdir: Optional[str] = None
        self.answers: dict[str, asyncio.Future[str]] = {}   # host -> its pending answer to connect's check

    async def connect(self, check: str = "") -> None:
        """One connection per remote host, in parallel (more only where ranks exceed sshd's MaxSessions), each with its
        watchdog; ``check``: what the first watchdog of each host asks it (``remote_check``; answers in :attr:`answers`)."""
        opts = self.ssh_options or ssh.SSHOptions()
        by_host: dict[str, list[int]] = {}
        for r, h in enumerate(self.hosts):
            if not h.is_local:
                by_host.setdefault(h.ssh, []).append(r)
        if not by_host:
            return
        self.log(f"connecting to {', '.join(by_host)}")
        per_conn = max(opts.max_sessions - 1, 1)   # one session is the watchdog
        try:
            first = await ssh.connect_all(list(by_host), opts)
            self.conns = {h: [c] for h, c in first.items()}
            extra = [name for name, ranks in by_host.items() for _ in range((len(ranks) - 1) // per_conn)]
            for name, conn in zip(extra, await asyncio.gather(*(ssh.connect(name, opts) for name in extra))):
                self.conns[name].append(conn)
        except ssh.SSHError as exc:
            raise LaunchError(str(exc)) from None
        for name, ranks in by_host.items():
            for k, r in enumerate(ranks):
                self.rank_conn[r] = self.conns[name][k // per_conn]
        conns = [(name, conn) for name, cs in self.conns.items() for conn in cs]
        dogs = await asyncio.gather(*(RemoteWatchdog.start(conn, f"ssh to {name}", self.start_timeout,
                                                         check if conn is self.conns[name][0] else "")
                                      for name, conn in conns), return_exceptions=True)
        for (name, conn), dog in zip(conns, dogs):
            if isinstance(dog, RemoteWatchdog):
                self.watchdogs[conn] = dog
                if dog.answer is not None:
                    self.answers[name] = dog.answer
        for dog in dogs:
            if isinstance(dog, BaseException):
                raise dog

    async def start_local_watchdog(self) -> LocalWatchdog:
        """The local ranks' watchdog, and with it this launch's local temp dir."""
        if self.local_watchdog is None:
            try:
                self.local_watchdog = await LocalWatchdog.start()
            except OSError as exc:
                raise LaunchError(f"cannot start the local ranks' watchdog (/bin/sh): {exc}") from None
            self.tmpdir = self.local_watchdog.path
        return self.local_watchdog

    def write_local_file(self, name: str, content: str) -> str:
        """A file in the launch's local temp dir; its path."""
        if self.tmpdir is None:
            self.tmpdir = tempfile.mkdtemp(prefix="mlx-jupyter-")
        path = os.path.join(self.tmpdir, name)
        with open(path, "w") as f:
            f.write(content)
        return path

    def drop(self) -> None:
        """Abort every connection (a host that does not answer): its ranks count as lost."""
        for conns in self.conns.values():
            for conn in conns:
                conn.abort()

    async def close(self, ranks_done: bool) -> None:
        """Close what the launch left: the remote watchdogs and connections once the ranks are done,
        the local watchdog (it kills any local group left) and the temp dir."""
        if ranks_done:
            # let each watchdog remove its dir before the connection goes (bounded: a lost host can't answer)
            dogs, self.watchdogs = list(self.watchdogs.values()), {}
            await asyncio.gather(*(dog.close() for dog in dogs))
            for conns in self.conns.values():
                for conn in conns:
                    conn.close()
            self.conns = {}
        if self.local_watchdog is not None:
            watchdog, self.local_watchdog = self.local_watchdog, None
            await watchdog.close()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
