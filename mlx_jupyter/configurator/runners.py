"""What `config` runs its commands through: ssh (:class:`SSHRunner`) or a recorded cluster
(:class:`RecordingRunner`), and a way to run coroutines from a notebook."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol, Sequence, TypeVar

from mlx_jupyter.topology import CommandResult, Recording

COMMAND_TIMEOUT = 60.0  # system_profiler takes a second or two; anything far beyond is a hung host
CONNECT_TIMEOUT = 5.0


class Runner(Protocol):
    """Runs one command on one host; implementations keep one connection per host. ``stdin`` is written
    to the command's stdin, which stays open until the command ends (secrets go there, not in argv)."""

    async def run(self, host: str, argv: Sequence[str], stdin: str = "") -> CommandResult: ...


class SSHRunner:
    """A `Runner` over `mlx_jupyter.net.ssh`: connects lazily, once per host, and reuses the connection."""

    def __init__(self, connect_timeout: float = CONNECT_TIMEOUT, command_timeout: float = COMMAND_TIMEOUT,
                 options: Any = None) -> None:
        """`options` (an `mlx_jupyter.net.ssh.SSHOptions`) replaces the defaults, connect timeout included."""
        from mlx_jupyter.net import ssh

        self._ssh = ssh
        self._opts = options or ssh.SSHOptions(connect_timeout=connect_timeout)
        self._timeout = command_timeout
        self._conns: dict[str, Any] = {}
        self._failed: dict[str, Exception] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def _connection(self, host: str) -> Any:
        async with self._locks.setdefault(host, asyncio.Lock()):
            if host in self._failed:  # do not wait for the timeout again
                raise self._failed[host]
            if host not in self._conns:
                try:
                    self._conns[host] = await self._ssh.connect(host, self._opts)
                except self._ssh.SSHError as exc:
                    self._failed[host] = exc
                    raise
            return self._conns[host]

    async def run(self, host: str, argv: Sequence[str], stdin: str = "") -> CommandResult:
        """Exit 255 with ssh's complaint on stderr when the host cannot be reached, as ssh(1) does."""
        try:
            conn = await self._connection(host)
            result = await self._ssh.run(conn, self._ssh.join(argv), self._timeout, host, stdin=stdin)
        except self._ssh.SSHError as exc:
            return CommandResult(255, "", f"{exc}\n")
        return CommandResult(
            result.exit_status if result.exit_status is not None else 255,
            _text(result.stdout),
            _text(result.stderr),
        )

    def peer_address(self, host: str) -> str | None:
        """The IP address the connection to `host` reached, once connected (None before, or if unknown)."""
        conn = self._conns.get(host)
        peer = conn.get_extra_info("peername") if conn is not None else None
        return peer[0] if isinstance(peer, tuple) and peer and isinstance(peer[0], str) else None

    async def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


def _text(data: Any) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)


T = TypeVar("T")


class RecordingRunner:
    """A :class:`Runner` that answers from a recorded cluster folder, as those Macs would."""

    def __init__(self, folder: str | Path) -> None:
        self.recording = Recording(folder)
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def hosts(self) -> list[str]:
        return self.recording.hosts()

    async def run(self, host: str, argv: Sequence[str], stdin: str = "") -> CommandResult:
        self.calls.append((host, tuple(argv)))
        return self.recording.answer(host, argv)

    async def close(self) -> None:
        return None


def run_async(factory: Callable[[], Awaitable[T]], timeout: float = 300.0) -> T:
    """Run a coroutine to completion in its own thread and loop (works inside a running kernel loop)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(factory())  # type: ignore[arg-type]
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name="mlx-jupyter-widget-action", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"the action did not finish within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value
