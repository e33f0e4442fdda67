"""Where a keep-state restart's files live on a host, whose they are, and their removal.

A restart's folder is named after the process that drives it (the notebook's kernel or the
Jupyter server: its host, pid and start time) so that a folder left by a driver that is gone
(killed in the middle of a restart) can be told from one in use, and swept at the next start.
Light on purpose: the notebook sweeps its own host at every cluster start.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

PREFIX = "mlx-jupyter-keep-"
#: mlx-jupyter-keep-<host tag>-<pid>-<start time>-<random>-<cluster id>
_NAME = re.compile(PREFIX + r"(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-(?P<started>\d+)-[0-9a-f]{16}-[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Owner:
    """The process that drives a restart: its host (a tag of the host's name), pid and start time."""

    host: str
    pid: int
    started: int


def keep_roots() -> list[Path]:
    """Where this host may keep the files, best first: shared memory when the OS has it (Linux),
    then the temp dir (a small /dev/shm, as Docker gives by default, leaves room for little)."""
    roots = []
    shm = Path("/dev/shm")
    if sys.platform.startswith("linux") and shm.is_dir() and os.access(shm, os.W_OK):
        roots.append(shm)
    tmp = Path(tempfile.gettempdir())
    if tmp not in roots:
        roots.append(tmp)
    return roots


def keep_root() -> Path:
    """The best place this host has for the files (:func:`keep_roots`' first)."""
    return keep_roots()[0]


def host_tag(hostname: Optional[str] = None) -> str:
    """A short tag of this host's name (a folder name holds it; host names can be long)."""
    return hashlib.sha1((hostname or socket.gethostname()).encode()).hexdigest()[:8]


def process_started(pid: int) -> Optional[int]:
    """When process ``pid`` started (whole seconds since the epoch); None if it does not exist."""
    try:
        import psutil

        return int(psutil.Process(pid).create_time())
    except ImportError:  # pragma: no cover - ipyparallel brings psutil
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    except Exception as exc:  # psutil.NoSuchProcess, ZombieProcess: it has ended
        return 0 if type(exc).__name__ == "AccessDenied" else None   # denied: it runs, its start unknown


def this_owner() -> Owner:
    """This process, as the owner of the folders it names."""
    return Owner(host_tag(), os.getpid(), process_started(os.getpid()) or 0)


def folder_name(cluster_id: str, token: str, owner: Optional[Owner] = None) -> str:
    """The name of one restart's folder, owned by ``owner`` (this process by default)."""
    o = owner or this_owner()
    return f"{PREFIX}{o.host}-{o.pid}-{o.started}-{token}-{cluster_id}"


def owner_of(name: str) -> Optional[Owner]:
    """Whose restart folder ``name`` is (None: not a name of ours)."""
    m = _NAME.fullmatch(name)
    return Owner(m["host"], int(m["pid"]), int(m["started"])) if m else None


def owner_gone(owner: Owner) -> bool:
    """Whether ``owner`` is a process of this host that no longer runs (its pid gone or reused)."""
    if owner.host != host_tag():
        return False   # another host's process: only that host can tell
    started = process_started(owner.pid)
    return started is None or (owner.started != 0 and started not in (0, owner.started))


def check_name(name: str) -> str:
    """``name`` if it is a keep folder's name (chosen by the notebook), else ValueError."""
    if not name or "/" in name or name.startswith(".") or not name.startswith(PREFIX):
        raise ValueError(f"bad keep folder name {name!r}")
    return name


def keep_dir(name: str, root: Optional[Path] = None) -> Path:
    """The folder ``name`` under ``root`` (default: the best place, :func:`keep_root`)."""
    return (root or keep_root()) / check_name(name)


def rank_folder(name: str, rank: int) -> Path:
    """The folder that holds rank ``rank``'s files of restart ``name`` (where its save found room)."""
    for root in keep_roots():
        if (keep_dir(name, root) / f"rank{rank}.index").exists():
            return keep_dir(name, root)
    return keep_dir(name)


def private_dir(folder: Path, create: bool) -> Path:
    """``folder``, made if asked, checked to be ours alone (a folder another user made or can
    read is refused: we unpickle what is in it)."""
    if create:
        folder.mkdir(mode=0o700, exist_ok=True)
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{folder} is not a private folder of this user: not used")
    return folder


def folders_here() -> list[str]:
    """The names of every restart folder of this user on this host."""
    mine: list[str] = []
    for root in keep_roots():
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for e in entries:
            if e.name.startswith(PREFIX) and e.name not in mine:
                try:
                    if e.stat(follow_symlinks=False).st_uid == os.getuid():
                        mine.append(e.name)
                except OSError:
                    pass
    return mine


def remove_all(name: str) -> None:
    """Remove this host's folder ``name``, wherever it is (nothing when it is gone already)."""
    for root in keep_roots():
        shutil.rmtree(keep_dir(name, root), ignore_errors=True)


def sweep_stale(names: Optional[list[str]] = None) -> list[str]:
    """Remove the restart folders on this host whose owner was a process of this host that is
    gone (``names``: only those); the names removed."""
    removed = []
    for name in folders_here() if names is None else names:
        owner = owner_of(name)
        if owner is not None and owner_gone(owner):
            remove_all(name)
            removed.append(name)
    return removed


def remove_folders(names: list[str]) -> list[str]:
    """Remove the restart folders ``names`` on this host (names of ours only; another host judged
    them stale: their owner ran there); the names removed."""
    removed = []
    for name in names:
        if owner_of(name) is not None and any((root / name).exists() for root in keep_roots()):
            remove_all(name)
            removed.append(name)
    return removed
