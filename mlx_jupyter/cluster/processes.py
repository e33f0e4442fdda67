"""Making sure a cluster's processes are gone: their trees, and reaping what is left."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from mlx_jupyter.net.hosts import is_local


def process_tree(pid: Optional[int]) -> list[int]:
    """``pid`` and all its descendants (just ``pid`` when psutil cannot tell)."""
    if not pid or pid < 0:
        return []
    try:
        import psutil

        proc = psutil.Process(pid)
        return [pid] + [c.pid for c in proc.children(recursive=True)]
    except Exception:
        return [pid]


def rank_pids(engine_set: Any) -> set[int]:
    """The processes of an engine set's ranks on this machine, with their children."""
    pids: set[int] = set()
    if engine_set.launcher is None:
        return pids
    for info in engine_set.launcher.ranks:
        if info.pid and is_local(info.host):
            pids.update(process_tree(info.pid))
    return pids


def reap(pids: Iterable[int], timeout: float) -> None:
    """Make sure these processes are gone: SIGTERM what is left, then SIGKILL."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return
    procs = []
    for pid in set(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    if not alive:
        return
    _, alive = psutil.wait_procs(alive, timeout=min(timeout, 1.0))
    for send, grace in ((psutil.Process.terminate, min(timeout, 2.0)), (psutil.Process.kill, 1.0)):
        for p in alive:
            try:
                send(p)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(alive, timeout=grace)
