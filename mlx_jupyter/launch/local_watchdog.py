"""The local ranks' watchdog: no local rank outlives its launcher, even one killed by SIGKILL.

A ``/bin/sh`` watcher, in its own session, blocks in ``read`` on a pipe whose
only write end the launcher holds (close-on-exec, and closed in children of
``os.fork``), so it costs no CPU and fires on every kind of launcher death.
At EOF (the launcher closed it, or died) it SIGKILLs the process group and
session of each rank registered in ``<dir>/pids/`` (every local rank leads its
own session; the launcher adds a rank once spawned and removes it once reaped)
and removes the launch's temp dir ``<dir>``. A pid file holds ``PID TOKEN`` lines, the group's
leader first, each with the process's start (:mod:`mlx_jupyter.proc_identity`): the group and
session are killed only while their leader is the very process registered (alive or a zombie, it
holds the id, so nobody else can have it), and a member recorded alone (its leader may be gone)
only while it is itself; a reused pid names another process and is left alone. Slurm jobs and steps registered in
``<dir>/slurm/`` (by id, or by the unique name given before the job id is known)
are cancelled with ``scancel``: an allocation never outlives its launcher either.

Linux's ``PR_SET_PDEATHSIG`` is not used: macOS has none, it needs a
``preexec_fn`` (unsafe in threaded processes such as a Jupyter kernel), and it
fires when the *thread* that spawned the rank exits, not the process.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
import threading
from typing import Iterable, Optional

from mlx_jupyter.proc_identity import SHELL_START_TOKEN, start_token

# $1: the temp base where a killed mpirun leaves its session dir, which Open MPI
# names ompi.<node>.<uid>/pid.<mpirun's pid> (mpirun leads the registered session).
# $2: the launch's temp dir. At EOF on stdin, each process group registered
# there is killed, and the rest of its session too: mpirun puts each of its
# ranks in a group of its own, in its session. There is no killpg for a
# session: pkill -s (macOS, Linux with procps), else Linux's /proc (each
# stat line is "pid (comm) state ppid pgrp session ..."; comm may hold
# anything, so fields are counted after its last ") "). HUP and INT are
# ignored: a closing terminal or a Ctrl-C must not take the guard away.
LOCAL_WATCHDOG_SCRIPT = r"""trap '' HUP INT PIPE
t=$1
d=$2
""" + SHELL_START_TOKEN + r"""
while read -r _; do :; done
for f in "$d"/pids/*; do
  [ -f "$f" ] || continue
  id=${f##*/}
  p= tok=
  { IFS=' ' read -r p tok; } <"$f" 2>/dev/null
  if [ "$p" = "$id" ] && [ -n "$tok" ] && [ "$(start_token "$id")" = "$tok" ]; then
    kill -s KILL -- "-$id" 2>/dev/null
    if command -v pkill >/dev/null 2>&1; then
      pkill -KILL -s "$id" 2>/dev/null
    elif [ -r /proc/self/stat ]; then
      for s in /proc/[0-9]*/stat; do
        IFS= read -r line 2>/dev/null <"$s" || continue
        set -f; set -- ${line##*) }; set +f
        [ "$4" = "$id" ] && p=${s#/proc/} && kill -s KILL "${p%/stat}" 2>/dev/null
      done
    fi
  fi
  while IFS=' ' read -r p tok; do
    case $p in ''|*[!0-9]*) continue ;; esac
    [ -n "$tok" ] && [ "$(start_token "$p")" = "$tok" ] && kill -s KILL "$p" 2>/dev/null
  done <"$f"
  rm -rf "$t"/ompi.*/pid."$id" 2>/dev/null
done
for f in "$d"/slurm/*; do
  [ -f "$f" ] || continue
  id=${f##*/}
  case $id in
    name=*) scancel --quiet --user="$(id -u)" --name="${id#name=}" 2>/dev/null ;;
    *) scancel --quiet -- "$id" 2>/dev/null ;;
  esac
done
rm -d "$t"/ompi.* 2>/dev/null   # only the empty ones, as Open MPI does at its own exit
rm -rf "$d"
"""

#: Where the watcher finds rm and pkill, after the launcher's own PATH.
STANDARD_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"

#: What the watcher may scancel: a job id, a step (job.step), or a job name we made unique.
_SLURM_TARGET = re.compile(r"^(?:[0-9]+(?:\.[0-9]+)?|name=[A-Za-z0-9_.-]+)$")

_open_fds: set[int] = set()
_fds_lock = threading.Lock()


def _close_in_child() -> None:
    # A forked, not exec'd, child (multiprocessing's fork start method) must not
    # keep the write end open: the watcher would then wait for that child too.
    for fd in list(_open_fds):
        try:
            os.close(fd)
        except OSError:
            pass
    _open_fds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


def watcher_path() -> str:
    """The watcher's PATH: the launcher's, then the standard directories."""
    return ":".join(p for p in [os.environ.get("PATH", ""), STANDARD_PATH] if p)


class LocalWatchdog:
    """One launch's temp dir (``path``) and the watcher guarding its local ranks."""

    def __init__(self, path: str, write_fd: int, proc: asyncio.subprocess.Process):
        self.path = path
        self.pid = proc.pid
        self._fd: Optional[int] = write_fd
        self._proc = proc

    @classmethod
    async def start(cls, env: Optional[dict[str, str]] = None) -> "LocalWatchdog":
        """Create the temp dir and start its watcher (``env``: more variables for it, e.g. ``SLURM_CONF``)."""
        path = tempfile.mkdtemp(prefix="mlx-jupyter-")   # mode 0700
        os.mkdir(os.path.join(path, "pids"))
        os.mkdir(os.path.join(path, "slurm"))
        read_fd, write_fd = os.pipe()   # both non-inheritable
        with _fds_lock:
            _open_fds.add(write_fd)
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", LOCAL_WATCHDOG_SCRIPT, "mlx-jupyter-watchdog", tempfile.gettempdir(), path,
                stdin=read_fd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True, env={**(env or {}), "PATH": watcher_path()},
            )
        except BaseException:
            _close(write_fd)
            shutil.rmtree(path, ignore_errors=True)
            raise
        finally:
            os.close(read_fd)
        return cls(path, write_fd, proc)

    def register(self, pgid: int) -> None:
        """Guard a rank's process group (call as soon as it is spawned, while it is our unreaped child:
        its start is read now, and a pid that no longer names it is never killed)."""
        token = start_token(int(pgid))
        with open(os.path.join(self.path, "pids", str(int(pgid))), "w") as f:
            f.write(f"{int(pgid)} {token}\n" if token else "")

    def add_members(self, pgid: int, pids: Iterable[int]) -> None:
        """Guard these processes of ``pgid``'s group one by one too (its leader may die before them)."""
        lines = [f"{int(p)} {tok}\n" for p in pids if int(p) != int(pgid) for tok in [start_token(int(p))] if tok]
        with open(os.path.join(self.path, "pids", str(int(pgid))), "a") as f:
            f.write("".join(lines))

    def unregister(self, pgid: int) -> None:
        """Forget a reaped rank (its group id may be reused)."""
        try:
            os.unlink(os.path.join(self.path, "pids", str(int(pgid))))
        except OSError:
            pass

    def register_job(self, job: str) -> None:
        """Cancel this Slurm job or step (``123``, ``123.4``, ``name=NAME``) if the launcher dies."""
        if not _SLURM_TARGET.match(job):
            raise ValueError(f"{job!r} is not a Slurm job id, step id or name=NAME")
        with open(os.path.join(self.path, "slurm", job), "w"):
            pass

    def unregister_job(self, job: str) -> None:
        """Forget a job that has been cancelled or has ended."""
        try:
            os.unlink(os.path.join(self.path, "slurm", job))
        except (OSError, ValueError):
            pass

    async def close(self, timeout: float = 2.0) -> None:
        """EOF to the watcher: it kills what is still registered and removes the dir; bounded wait."""
        if self._fd is not None:
            _close(self._fd)
            self._fd = None
        try:
            await asyncio.wait_for(self._proc.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        shutil.rmtree(self.path, ignore_errors=True)


def _close(fd: int) -> None:
    with _fds_lock:
        _open_fds.discard(fd)
    os.close(fd)
