"""One ssh connection per remote host (more past its MaxSessions), each with its watchdog; the local ranks' guard."""

from __future__ import annotations

import asyncio
import os
import tempfile

from mlx_jupyter.net import ssh
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.guard import LocalWatchdog
from mlx_jupyter.launch.remote import Watchdog


class Connections:
    """Part of :class:`~mlx_jupyter.launch.job.Job`: reaching the hosts."""

    async def _connect(self) -> None:
        """One connection per remote host, in parallel (more only where ranks exceed sshd's MaxSessions), each with its watchdog."""
        opts = self.config.ssh_options or ssh.SSHOptions()
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
            self._conns = {h: [c] for h, c in first.items()}
            extra = [h for h, ranks in by_host.items() for _ in range((len(ranks) - 1) // per_conn)]
            for h, conn in zip(extra, await asyncio.gather(*(ssh.connect(h, opts) for h in extra))):
                self._conns[h].append(conn)
        except ssh.SSHError as exc:
            raise LaunchError(str(exc)) from None
        for h, ranks in by_host.items():
            for k, r in enumerate(ranks):
                self._rank_conn[r] = self._conns[h][k // per_conn]
        conns = [(h, conn) for h, cs in self._conns.items() for conn in cs]
        dogs = await asyncio.gather(*(Watchdog.start(conn, f"ssh to {h}", self.config.start_timeout)
                                      for h, conn in conns), return_exceptions=True)
        for (_, conn), dog in zip(conns, dogs):
            if isinstance(dog, Watchdog):
                self._watchdogs[conn] = dog
        for dog in dogs:
            if isinstance(dog, BaseException):
                raise dog

    async def _start_guard(self) -> None:
        """The local ranks' watchdog, and with it this launch's local temp dir."""
        if self._guard is None:
            try:
                self._guard = await LocalWatchdog.start()
            except OSError as exc:
                raise LaunchError(f"cannot start the local ranks' watchdog (/bin/sh): {exc}") from None
            self._tmpdir = self._guard.path

    def _write_local_file(self, name: str, content: str) -> str:
        if self._tmpdir is None:
            self._tmpdir = tempfile.mkdtemp(prefix="mlx-jupyter-")
        path = os.path.join(self._tmpdir, name)
        with open(path, "w") as f:
            f.write(content)
        return path
