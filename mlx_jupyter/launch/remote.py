"""A rank on another host: the wrapper script over an ssh session, signals over a side channel."""

from __future__ import annotations

import asyncio
import signal as _signal
from typing import Any, Optional

from mlx_jupyter import ssh
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.output import LineSplitter, pump
from mlx_jupyter.launch.script import MARKER

#: Return code reported for a rank whose host stopped answering.
LOST_CODE = 255
#: Bound on delivering a signal (a session open plus ``kill``).
SIGNAL_TIMEOUT = 5.0


class RemoteProcess:
    """One remote rank. ``pid`` is its process group id on that host."""

    def __init__(self, conn: Any, proc: Any, pid: int, pumps: list[asyncio.Task], label: str):
        self._conn = conn
        self._proc = proc
        self._pumps = pumps
        self._label = label
        self.pid = pid
        self.lost_reason: Optional[str] = None

    @classmethod
    async def spawn(
        cls,
        conn: Any,
        script: str,
        stdin: bool,
        out: LineSplitter,
        err: LineSplitter,
        label: str,
        timeout: float,
    ) -> "RemoteProcess":
        """Run ``script`` in a new session on ``conn``; return once it reports its pid."""
        try:
            proc = await asyncio.wait_for(conn.create_process(ssh.sh_command(script), encoding=None), timeout)
        except asyncio.TimeoutError:
            raise LaunchError(f"{label}: the ssh session did not open within {timeout:g} s") from None
        except Exception as exc:  # noqa: BLE001 - asyncssh raises several unrelated types here
            raise LaunchError(f"{label}: cannot open an ssh session ({type(exc).__name__}: {exc})") from None
        if not stdin:
            proc.stdin.write_eof()
        marker = MARKER.encode() + b" "
        try:
            while True:   # a login shell may print before our marker: pass that on
                line = await asyncio.wait_for(proc.stdout.readline(), timeout)
                if not line or line.startswith(marker):
                    break
                out.feed(line)
        except asyncio.TimeoutError:
            proc.close()
            raise LaunchError(f"{label}: the rank did not start within {timeout:g} s") from None
        except Exception as exc:  # noqa: BLE001
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
        pid = int(line[len(marker):].strip())
        pumps = [asyncio.ensure_future(pump(proc.stdout, out)), asyncio.ensure_future(pump(proc.stderr, err))]
        return cls(conn, proc, pid, pumps, label)

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
    def conn(self) -> Any:
        """The ssh connection this rank runs on."""
        return self._conn

    async def signal(self, sig: int) -> None:
        """Send ``sig`` to the rank's process group over a separate ssh channel."""
        await signal_groups(self._conn, [self.pid], sig)

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


async def signal_groups(conn: Any, pgids: list[int], sig: int, timeout: float = SIGNAL_TIMEOUT) -> None:
    """Signal several process groups on one host with a single ssh command (one extra session)."""
    name = _signal.Signals(sig).name.removeprefix("SIG")
    targets = " ".join(f"-{int(p)}" for p in pgids)
    try:
        await ssh.run(conn, f"kill -s {name} -- {targets} 2>/dev/null", timeout)
    except Exception:  # noqa: BLE001 - the host may be gone; the rank's wait() reports it
        pass
