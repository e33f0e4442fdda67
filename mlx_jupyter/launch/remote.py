"""A rank on another host: the wrapper script over an ssh session; signals through the connection's watchdog."""

from __future__ import annotations

import asyncio
import signal as _signal
from typing import TYPE_CHECKING, Awaitable, Callable, Optional

from mlx_jupyter.net import ssh
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.streams import LineSplitter, pump
from mlx_jupyter.launch.script import MARKER, watchdog_script

if TYPE_CHECKING:   # asyncssh is imported at run time through net.ssh only (its warnings silenced there)
    from asyncssh import SSHClientConnection, SSHClientProcess

#: Return code reported for a rank whose host stopped answering.
LOST_CODE = 255


class RemoteProcess:
    """One remote rank. ``pid`` is its process group id on that host."""

    def __init__(self, conn: SSHClientConnection, proc: SSHClientProcess[bytes], pid: int,
                 pumps: list[asyncio.Task[None]]):
        self._conn = conn
        self._proc = proc
        self._pumps = pumps
        self.pid = pid
        self.lost_reason: Optional[str] = None

    @classmethod
    async def spawn(
        cls,
        conn: SSHClientConnection,
        script: str,
        stdin: bool,
        out: LineSplitter,
        err: LineSplitter,
        label: str,
        timeout: float,
        setup: str = "",
    ) -> "RemoteProcess":
        """Run ``script`` in a new session on ``conn``; return once it reports its pid.

        ``setup`` (the rank's settings, secrets among them) goes first on the session's stdin:
        never in the command line, which every user of that host can read.
        """
        proc = await _open(conn, script, label, timeout)
        if setup:
            proc.stdin.write(setup.encode())
        if not stdin:
            proc.stdin.write_eof()
        line = await _read_marker(proc, out.feed, label, timeout)
        pid = int(line.strip())
        pumps = [asyncio.ensure_future(pump(proc.stdout, out)), asyncio.ensure_future(pump(proc.stderr, err))]
        return cls(conn, proc, pid, pumps)

    async def wait(self) -> Optional[int]:
        """Wait until the session ends; the exit code, or ``LOST_CODE`` if the host was lost."""
        try:
            await self._proc.wait_closed()
        except Exception as exc:  # noqa: BLE001 - a closed connection surfaces here or below
            self.lost_reason = str(exc) or type(exc).__name__
        await asyncio.gather(*self._pumps, return_exceptions=True)
        if self._proc.exit_status is not None:
            return self._proc.exit_status
        if self._proc.exit_signal:
            return 128 + int(getattr(_signal, "SIG" + self._proc.exit_signal[0], 0))
        self.lost_reason = ssh.lost_reason(self._conn) or self.lost_reason or \
            "the ssh connection closed before the rank exited"
        return LOST_CODE

    @property
    def conn(self) -> SSHClientConnection:
        """The ssh connection this rank runs on."""
        return self._conn

    def write(self, data: bytes) -> None:
        """Forward stdin bytes."""
        try:
            self._proc.stdin.write(data)
        except Exception:  # noqa: BLE001 - channel closed
            pass

    def close_stdin(self) -> None:
        """Send EOF to the rank's stdin."""
        try:
            self._proc.stdin.write_eof()
        except Exception:  # noqa: BLE001
            pass


async def _open(conn: SSHClientConnection, script: str, label: str, timeout: float) -> SSHClientProcess[bytes]:
    """A new ssh session running ``script`` under /bin/sh, bytes in and out."""
    opening: Awaitable[SSHClientProcess[bytes]] = conn.create_process(ssh.sh_command(script), encoding=None)
    try:
        return await asyncio.wait_for(opening, timeout)
    except asyncio.TimeoutError:
        raise LaunchError(f"{label}: the ssh session did not open within {timeout:g} s") from None
    except Exception as exc:  # noqa: BLE001 - asyncssh raises several unrelated types here
        raise LaunchError(f"{label}: cannot open an ssh session ({type(exc).__name__}: {exc})") from None


async def _read_marker(proc: SSHClientProcess[bytes], early: Callable[[bytes], None], label: str,
                       timeout: float) -> bytes:
    """The text after the marker on the first marker line; earlier lines (a login banner) go to ``early``."""
    marker = MARKER.encode() + b" "
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout)
            if not line or line.startswith(marker):
                break
            early(line)
    except asyncio.TimeoutError:
        proc.close()
        raise LaunchError(f"{label}: did not start within {timeout:g} s") from None
    except Exception as exc:  # noqa: BLE001 - asyncssh raises several unrelated types here
        raise LaunchError(f"{label}: the ssh session broke while starting ({exc})") from None
    if not line:
        errors = b""
        try:
            errors = await asyncio.wait_for(proc.stderr.read(), 2.0)
            await asyncio.wait_for(proc.wait_closed(), 2.0)
        except Exception:  # noqa: BLE001 - best effort to explain the failure
            pass
        text = errors.decode(errors="replace").strip() or "no message"
        raise LaunchError(f"{label}: could not start (exit {proc.returncode}): {text}")
    return line[len(marker):]


class RemoteWatchdog:
    """The per-connection watchdog session (``script.REMOTE_WATCHDOG_SCRIPT``): kills this launch's ranks if we vanish.

    It also delivers signals: one line per request, no ssh session each.
    """

    def __init__(self, proc: SSHClientProcess[bytes], path: str):
        self._proc = proc
        self.path = path   # its registry dir on the host
        self.answer: Optional[asyncio.Future[str]] = None   # the host's answer to ``check`` (remote_check)

    @classmethod
    async def start(cls, conn: SSHClientConnection, label: str, timeout: float, check: str = "") -> "RemoteWatchdog":
        """Open the watchdog session on ``conn``; return once it has made its registry dir. ``check``: shell
        lines it runs in the background, whose answer :attr:`answer` reads (``remote_check.read_answer``)."""
        proc = await _open(conn, watchdog_script(check), f"{label} (watchdog)", timeout)
        path = await _read_marker(proc, lambda line: None, f"{label} (watchdog)", timeout)
        dog = cls(proc, path.decode(errors="replace").strip())
        if check:
            from mlx_jupyter.launch.remote_check import read_answer

            dog.answer = asyncio.ensure_future(read_answer(proc.stdout))
        return dog

    def signal(self, pgids: list[int], sig: int) -> None:
        """Send ``sig`` to these process groups (fire and forget: a dead host is reported by its ranks)."""
        name = _signal.Signals(sig).name.removeprefix("SIG")
        try:
            self._proc.stdin.write(f"{name} {' '.join(f'-{int(p)}' for p in pgids)}\n".encode())
        except Exception:  # noqa: BLE001 - channel closed: the host is gone
            pass

    async def close(self, timeout: float = 2.0) -> None:
        """End the watchdog (it kills what is still registered and removes its dir); bounded wait."""
        try:
            self._proc.stdin.write_eof()
            await asyncio.wait_for(self._proc.wait_closed(), timeout)
        except Exception:  # noqa: BLE001 - host gone or slow: its sshd ends the session anyway
            pass
