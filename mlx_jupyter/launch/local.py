"""A rank on this machine: a child process in its own session, no shell involved."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as _signal
import weakref
from typing import Any, Iterator, Mapping, Optional, Sequence

from mlx_jupyter.vocab.backends import RECORDS
from mlx_jupyter.vocab import binding
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.local_watchdog import LocalWatchdog
from mlx_jupyter.launch.streams import LineSplitter, pump
from mlx_jupyter.proc_identity import start_token


#: backends a machine may lack (the ring is built in; mpi's ranks are mpirun's to start): their records say
CHECKED_BACKENDS = tuple(b.name for b in RECORDS if b.checked)
#: set to 0 in the launcher's environment to start the ranks anyway (a probe that misses a custom install)
CHECK_VAR = "MLX_JUPYTER_CHECK_BACKEND"


def refuse_unavailable(backend: str, rows: Optional[list[dict[str, Any]]] = None,
                       environ: Optional[Mapping[str, str]] = None) -> None:
    """LaunchError, in one line, when ``backend`` cannot run on this machine (``rows``: ``distributed.backends()``):
    its ranks would start and fail later on MLX's message about another backend."""
    if backend not in CHECKED_BACKENDS or (os.environ if environ is None else environ).get(CHECK_VAR) == "0":
        return
    if rows is None:
        from mlx_jupyter.distributed import backends

        rows = backends()
    row = next((r for r in rows if r["name"] == backend), None)
    if row is not None and not row["available"]:
        raise LaunchError(f"the {backend} backend cannot run on this machine ({row['detail']}): "
                          f"see `mlx-jupyter doctor` ({CHECK_VAR}=0 starts the ranks anyway)")


_SPAWN_LOCKS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]" = weakref.WeakKeyDictionary()


def _spawn_lock() -> asyncio.Lock:
    """The running loop's lock around a spawn (a lock belongs to one loop)."""
    loop = asyncio.get_running_loop()
    lock = _SPAWN_LOCKS.get(loop)
    if lock is None:
        lock = _SPAWN_LOCKS[loop] = asyncio.Lock()
    return lock


@contextlib.contextmanager
def _blocked_for_children(hold_usr1: bool) -> Iterator[None]:
    """While inside, this thread blocks SIGUSR1, and so does every process it spawns: the signal mask
    survives fork and exec, so a SIGUSR1 before the child's boot code runs stays pending."""
    if not hold_usr1:
        yield
        return
    before = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGUSR1})
    try:
        yield
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, before)


class LocalProcess:
    """One local rank: spawn, stdin, signals to its whole process group, wait."""

    def __init__(self, proc: asyncio.subprocess.Process, pumps: list[asyncio.Task[None]],
                 watchdog: Optional[LocalWatchdog] = None, watchdog_session: bool = False):
        self._proc = proc
        self._pumps = pumps
        self._watchdog = watchdog
        self._watchdog_session = watchdog_session
        self.pid: int = proc.pid
        self.bound = False   # runs on the CPUs it was given (spawn's cpus=)

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Optional[str],
        stdin: bool,
        out: LineSplitter,
        err: LineSplitter,
        label: str,
        watchdog: Optional[LocalWatchdog] = None,
        watchdog_session: bool = False,
        cpus: Optional[frozenset[int]] = None,
        hold_usr1: bool = False,
    ) -> "LocalProcess":
        """Start ``argv`` with exactly ``env``; raise :class:`LaunchError` naming ``label``.

        ``watchdog`` kills its group if the launcher dies; with ``watchdog_session``
        it stays registered after exit, so that ``watchdog.close()`` kills what is
        left of its session (mpirun's ranks, each in a group of its own). ``cpus``: the
        CPUs it runs on from its first instruction (vocab.binding). ``hold_usr1``: it starts with
        SIGUSR1 blocked (pending, not fatal) until its boot code waits for it (``--where-on-signal``).
        """
        try:
            # One spawn at a time in this thread: its CPUs are the next child's for the while.
            async with _spawn_lock():
                with binding.for_children(cpus) as bound, _blocked_for_children(hold_usr1):
                    proc = await asyncio.create_subprocess_exec(
                        *argv,
                        stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                        env=dict(env),
                        cwd=cwd,
                        start_new_session=True,   # own process group: signal the rank and its children
                    )
        except FileNotFoundError:
            if cwd is not None and not os.path.isdir(cwd):
                raise LaunchError(f"{label}: working directory {cwd!r} does not exist") from None
            raise LaunchError(f"{label}: command {argv[0]!r} not found (check PATH or give a full path)") from None
        except PermissionError:
            raise LaunchError(f"{label}: permission denied running {argv[0]!r} (is it executable?)") from None
        except OSError as exc:
            raise LaunchError(f"{label}: cannot start {argv[0]!r}: {exc.strerror or exc}") from None
        if watchdog is not None:
            try:
                watchdog.register(proc.pid)
            except OSError as exc:   # don't leave a rank running unguarded
                os.killpg(proc.pid, _signal.SIGKILL)
                await proc.wait()
                raise LaunchError(f"{label}: cannot register it with the launcher's watchdog: {exc}") from None
        assert proc.stdout is not None and proc.stderr is not None
        pumps = [asyncio.ensure_future(pump(proc.stdout, out)), asyncio.ensure_future(pump(proc.stderr, err))]
        self = cls(proc, pumps, watchdog, watchdog_session)
        self.bound = bound
        return self

    async def wait(self) -> Optional[int]:
        """Wait for exit and the end of its output; kill what is left of its group."""
        code = await self._proc.wait()
        if start_token(self.pid) is None:   # reaped: a process with its pid now is another's, and so is its group
            self._killpg(_signal.SIGKILL)
        if self._watchdog is not None and not self._watchdog_session:
            self._watchdog.unregister(self.pid)
        await asyncio.gather(*self._pumps, return_exceptions=True)
        return code

    async def signal(self, sig: int) -> None:
        """Send ``sig`` to the rank's process group (not once it has been reaped: its pid may be reused)."""
        if self._proc.returncode is None:
            self._killpg(sig)

    def write(self, data: bytes) -> None:
        """Forward stdin bytes (dropped if the rank closed its stdin)."""
        stdin = self._proc.stdin
        if stdin is not None and not stdin.is_closing():
            try:
                stdin.write(data)
            except (BrokenPipeError, ConnectionResetError, RuntimeError):
                pass

    def close_stdin(self) -> None:
        """Send EOF to the rank's stdin."""
        stdin = self._proc.stdin
        if stdin is not None and not stdin.is_closing():
            try:
                stdin.close()
            except (BrokenPipeError, ConnectionResetError, RuntimeError):
                pass

    def _killpg(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
