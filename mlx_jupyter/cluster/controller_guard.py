"""The controller's process group: whether the controller is alive, and an end for every process of it.

ipyparallel starts the controller in a session of its own (so its group is the controller's
pid), and the controller forks a child of its own. Killed by SIGKILL, the controller left that
child to init, where it outlived ``Cluster.stop()`` and the notebook. Here the group is
registered with a :class:`~mlx_jupyter.launch.local_watchdog.LocalWatchdog`, which kills it
when the notebook dies (even by SIGKILL), and :meth:`ControllerGuard.end` kills it at stop.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any, Optional

from mlx_jupyter.cluster.cells.text import describe_exit

log = logging.getLogger("mlx_jupyter.cluster")


class ControllerGuard:
    """Watches the controller ipyparallel started (``launcher``) and guards its process group."""

    def __init__(self, launcher: Any, watchdog: bool = True) -> None:
        self.launcher = launcher
        self.pid: int = int(launcher.pid)
        self.pgid: Optional[int] = _own_group(self.pid)
        self.exit_code: Optional[int] = None   # -1: ended, how unknown
        #: its connection files: a killed controller leaves them, and a new one's client would read them
        self.files = list(getattr(launcher, "connection_files", {}).values())
        self._watchdog: Any = None
        if watchdog and self.pgid is not None:
            try:
                self._watchdog = _start_watchdog()
                self._watchdog.register(self.pgid)
            except Exception as exc:  # the controller still runs; only the guard is missing
                log.warning("no watchdog for the controller's processes (group %s): %s", self.pgid, exc)

    def stopped(self, data: Any) -> None:
        """ipyparallel saw the controller end (its wait thread)."""
        code = data.get("exit_code") if isinstance(data, dict) else None
        self.exit_code = int(code) if isinstance(code, int) else -1

    def gone(self) -> str:
        """Why the controller is gone ("" while it runs): how it ended, when known."""
        if self.exit_code is None:
            if getattr(self.launcher, "state", "") == "after":   # ipyparallel's wait saw it end
                self.stopped(getattr(self.launcher, "stop_data", None))
            elif not _running(getattr(self.launcher, "process", None)):   # before its next look
                self.exit_code = _reap(self.launcher.process)
        if self.exit_code is None:
            return ""
        how = describe_exit(self.exit_code) if self.exit_code != -1 else "it ended"
        return f"the cluster's controller (pid {self.pid}) is dead ({how})"

    def end(self) -> None:
        """Kill whatever is left of the controller's group (its orphaned child too); release the watchdog."""
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except OSError:
                pass
        for path in self.files if self.exit_code is not None else ():
            try:
                os.unlink(path)
            except OSError:
                pass
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            import asyncio

            from mlx_jupyter.launch.launcher import _background_loop

            try:
                asyncio.run_coroutine_threadsafe(watchdog.close(), _background_loop()).result(5)
            except Exception as exc:
                log.debug("the controller's watchdog did not close: %s", exc)


def _running(process: Any) -> bool:
    """Whether a psutil.Process still runs (a zombie does not; unknowable: True)."""
    if process is None:
        return True
    try:
        import psutil

        return process.status() != psutil.STATUS_ZOMBIE
    except Exception as exc:
        return type(exc).__name__ not in ("NoSuchProcess", "ZombieProcess")


def _reap(process: Any) -> int:
    """The exit code of our ended child ``process`` (reaped here), -1 when unknown."""
    try:
        code = process.wait(0)
    except Exception:
        return -1
    return int(code) if isinstance(code, int) else -1


def _own_group(pid: int) -> Optional[int]:
    """``pid``'s process group when it is its own (never ours: killing it would kill this process)."""
    try:
        pgid = os.getpgid(pid)
    except OSError:
        return None
    return pgid if pgid == pid and pgid != os.getpgrp() else None


def _start_watchdog() -> Any:
    import asyncio

    from mlx_jupyter.launch.launcher import _background_loop
    from mlx_jupyter.launch.local_watchdog import LocalWatchdog

    return asyncio.run_coroutine_threadsafe(LocalWatchdog.start(), _background_loop()).result(30)
