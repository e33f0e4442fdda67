"""The controller's process group: whether the controller is alive, and an end for every process of it.

ipyparallel starts the controller in a session of its own (so its group is the controller's
pid), and the controller forks a child of its own. Killed by SIGKILL, the controller left that
child to init, where it outlived ``Cluster.stop()`` and the notebook. Here the group is
registered with a :class:`~mlx_jupyter.launch.local_watchdog.LocalWatchdog`, which kills it
when the notebook dies (even by SIGKILL), and :meth:`ControllerGuard.end` kills it at stop.
Every kill checks identity first (:mod:`mlx_jupyter.proc_identity`): the group only while the
controller is the process started (alive or unreaped, it holds the group's id), its child only
while that is the process recorded; a pid reused since is left alone.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any, Optional

from mlx_jupyter.cluster.cells.text import describe_exit
from mlx_jupyter.proc_identity import same_process, start_token

log = logging.getLogger("mlx_jupyter.cluster")


class ControllerGuard:
    """Watches the controller ipyparallel started (``launcher``) and guards its process group."""

    def __init__(self, launcher: Any, watchdog: bool = True) -> None:
        self.launcher = launcher
        pid = getattr(launcher, "pid", None)
        #: None: a controller that is not a process of ours (ipyparallel's ssh or batch launchers): not guarded
        self.pid: Optional[int] = int(pid) if isinstance(pid, int) else None
        self.pgid: Optional[int] = _own_group(self.pid) if self.pid is not None else None
        #: when the controller started: a pid that no longer has it is someone else's
        self.token = start_token(self.pid) if self.pid is not None else None
        #: the group's other processes (the heart monitor it forks), each with its start (:meth:`record_members`)
        self.members: dict[int, str] = {}
        self.exit_code: Optional[int] = None   # -1: ended, how unknown
        #: its connection files: a killed controller leaves them, and a new one's client would read them
        self.files = list(getattr(launcher, "connection_files", {}).values())
        #: the watchdog guarding the group, being started off the cluster's start path (a process spawn)
        self._watchdog: Any = _start_watchdog(self.pgid) if watchdog and self.pgid is not None else None

    def record_members(self) -> None:
        """Note the group's other processes now (the controller is up: it has forked them), for the
        watchdog and :meth:`end` to kill one by one once the controller itself is gone."""
        if self.pgid is None or self.pid is None:
            return
        self.members = {p: tok for p in _descendants(self.pid) if _group_of(p) == self.pgid
                        for tok in [start_token(p)] if tok}
        pending, pgid, members = self._watchdog, self.pgid, dict(self.members)
        if pending is not None and members:
            pending.add_done_callback(lambda f: f.exception() is None and f.result().add_members(pgid, members))

    def stopped(self, data: Any) -> None:
        """ipyparallel saw the controller end (its wait thread)."""
        code = data.get("exit_code") if isinstance(data, dict) else None
        self.exit_code = int(code) if isinstance(code, int) else -1

    def gone(self) -> str:
        """Why the controller is gone ("" while it runs). Cheap (asked before every request): one
        ``waitid`` that peeks at our child without reaping it (ipyparallel's own wait for it can
        take 30 s to notice)."""
        if self.exit_code is None:
            if getattr(self.launcher, "state", "") == "after":
                self.stopped(getattr(self.launcher, "stop_data", None))
            elif self.pid is not None:
                self.exit_code = _peek_exit(self.pid, getattr(self.launcher, "_popen_process", None))
                if self.exit_code is None and _ended(self.pid):   # dead, and waitid did not say so yet
                    self.exit_code = -1
        if self.exit_code is None:
            return ""
        how = f" ({describe_exit(self.exit_code)})" if self.exit_code != -1 else ""
        return f"the cluster's controller (pid {self.pid}) is dead{how}"

    def end(self) -> None:
        """Kill whatever is left of the controller's group (its orphaned child too); release the watchdog."""
        if self.pgid is not None and self.pid is not None and same_process(self.pid, self.token):
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except OSError:
                pass
        for pid, token in self.members.items():   # the controller reaped: its group's id may be free
            if same_process(pid, token):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for path in self.files if self.exit_code is not None else ():
            try:
                os.unlink(path)
            except OSError:
                pass
        pending, self._watchdog = self._watchdog, None
        if pending is not None:
            import asyncio

            from mlx_jupyter.launch.launcher import _background_loop

            try:
                watchdog = pending.result(30)
                asyncio.run_coroutine_threadsafe(watchdog.close(), _background_loop()).result(5)
            except Exception as exc:
                log.warning("the controller's watchdog did not start or close: %s", exc)


def _peek_exit(pid: int, popen: Any) -> Optional[int]:
    """Our child ``pid``'s exit code (negative: the signal) if it has ended, else None; -1 when it
    ended but how is unknown (someone else reaped it)."""
    if hasattr(os, "waitid"):   # Linux, macOS: look without reaping (ipyparallel's wait reaps it)
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return -1
        except OSError:
            return None
        if info is None:
            return None
        exited = info.si_code == os.CLD_EXITED
        return info.si_status if exited else -info.si_status
    code = popen.poll() if popen is not None else None   # elsewhere: reaps it
    return None if code is None else int(code)


def _ended(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie. Right after a SIGKILL, ``waitid`` has been seen to answer
    "still running" for a controller that ``/proc`` already showed as a zombie (a restart then missed
    the death). The zombie check reads ``/proc`` (Linux); elsewhere only a pid that is gone counts."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
    except OSError:
        return False
    return bool(fields) and fields[0] in ("Z", "X")


def _descendants(pid: int) -> list[int]:
    """``pid``'s descendants now (none when psutil, which ipyparallel brings, cannot tell)."""
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []


def _group_of(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _own_group(pid: int) -> Optional[int]:
    """``pid``'s process group when it is its own (never ours: killing it would kill this process)."""
    try:
        pgid = os.getpgid(pid)
    except OSError:
        return None
    return pgid if pgid == pid and pgid != os.getpgrp() else None


def _start_watchdog(pgid: int) -> Any:
    """A future of a watchdog guarding process group ``pgid``, started on the launcher's loop."""
    import asyncio

    from mlx_jupyter.launch.launcher import _background_loop
    from mlx_jupyter.launch.local_watchdog import LocalWatchdog

    async def guard() -> LocalWatchdog:
        watchdog = await LocalWatchdog.start()
        watchdog.register(pgid)
        return watchdog

    return asyncio.run_coroutine_threadsafe(guard(), _background_loop())
