"""Running clusters, as small JSON files in Jupyter's runtime dir, so the lab panel's server sees them.

A process that owns a `Cluster` publishes it (`publish(cluster)`); the server lists the files and
drops those whose owner has died. One file per cluster: `<runtime>/mlx-jupyter/clusters/<id>.json`.
An entry names its owner and controller with their starts (:mod:`mlx_jupyter.proc_identity`): a
pid reused since says nothing of them. A dead owner's entry goes (:func:`sweep`, at every start and
listing) with its dead controller's key files (``ipcontroller-<id>-*.json``, ``cluster-<id>.json``),
which a SIGKILL left.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from mlx_jupyter.vocab.hosts import is_local
from mlx_jupyter.proc_identity import running, same_process, start_token

log = logging.getLogger("mlx_jupyter.cluster")


def folder() -> Path:
    """Where the cluster files live (honours JUPYTER_RUNTIME_DIR)."""
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "mlx-jupyter" / "clusters"


def profile_dir() -> str:
    """The IPython profile our controllers keep their files in: ours, beside the cluster files.

    Not in $IPYTHONDIR, where ipyparallel's own lab panel looks: it would list our clusters as its
    (``default:mlx-…``, with a START button that cannot start them). Connecting goes through
    :func:`describe`'s absolute connection-file path, so nothing else needs to find it.
    """
    from IPython.core.profiledir import ProfileDir

    # IPython's ProfileDir is untyped
    profile = ProfileDir.create_profile_dir(str(folder().parent / "ipython-profile"))  # type: ignore[no-untyped-call]
    return str(profile.location)


def describe(cluster: Any, owner: str = "kernel", busy: Sequence[int] = ()) -> dict[str, Any]:
    """What the panel needs to list a cluster and connect to it (no live query of the ranks);
    ``busy``: the ranks running a cell now (the owner republishes at each cell's start and end)."""
    ranks = []
    try:
        infos = cluster.engine_set.launcher.ranks
    except Exception:
        infos = []
    for info in infos:
        ranks.append({"rank": info.rank, "host": info.host, "pid": info.pid})
    slurm = _slurm(cluster)
    # a Slurm cluster's hosts are its ranks' nodes (cluster.hosts is only the default 127.0.0.1)
    hosts = list(cluster.hosts)
    if slurm is not None:
        hosts = list(dict.fromkeys(str(r["host"]) for r in ranks)) or list(slurm["nodes"])
    return {
        "client_file": _client_file(cluster),
        "id": cluster.cluster_id, "owner": owner, "owner_pid": os.getpid(), "backend": cluster.backend,
        "hosts": hosts, "hostfile": cluster.hostfile, "size": cluster.size,
        "local": bool(getattr(cluster, "local", True)), "ranks": ranks, "published": time.time(),
        "busy": sorted(busy), "dead": _dead(cluster),
        "slurm": slurm,
        "controller_pid": _controller_pid(cluster), "controller_start": _controller_start(cluster),
        "owner_start": start_token(os.getpid()),
    }


def _controller_start(cluster: Any) -> Optional[str]:
    """When the controller started (its guard's record, taken when it was started)."""
    guard = getattr(getattr(cluster, "processes", None), "guard", None)
    token = getattr(guard, "token", None)
    return token if isinstance(token, str) else None


def _dead(cluster: Any) -> list[int]:
    """The ranks whose process the owner saw end (it republishes at each death): the panel's word on
    ranks on other hosts, whose pids the server cannot look at."""
    try:
        return sorted(int(r) for r in cluster.table.dead)
    except Exception:
        return []


def _controller_pid(cluster: Any) -> Optional[int]:
    """The controller's pid (on this machine): a connected notebook sees it die."""
    try:
        return int(cluster.ipp.controller.pid)
    except Exception:
        return None


def _slurm(cluster: Any) -> Optional[dict[str, Any]]:
    """The Slurm job a cluster's ranks run in (its live state is squeue's: ``slurm_allocation.job_info``)."""
    alloc = getattr(cluster, "allocation", None)
    if alloc is None or alloc.job_id is None:
        return None
    return {"job_id": alloc.job_id, "nodes": list(alloc.nodes), "on_failure": alloc.on_failure}


def _client_file(cluster: Any) -> Optional[str]:
    """The controller's client connection file, which a notebook connecting to the cluster reads."""
    try:
        return str(cluster.ipp.controller.connection_files["client"])
    except Exception:
        return getattr(cluster, "client_file", None)


def _path(cluster_id: str) -> Path:
    if not cluster_id or "/" in cluster_id or cluster_id.startswith("."):
        raise ValueError(f"bad cluster id {cluster_id!r}")
    return folder() / f"{cluster_id}.json"


def publish(cluster: Any, owner: str = "kernel", busy: Sequence[int] = ()) -> Path:
    """Write (or refresh) the cluster's file; atomic, so readers never see half a file."""
    data = describe(cluster, owner, busy)
    path = _path(data["id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
    return path


def publish_quietly(cluster: Any, owner: str = "kernel", busy: Sequence[int] = ()) -> None:
    """:func:`publish`, logging a failure (a read-only runtime dir) instead of raising."""
    try:
        publish(cluster, owner, busy=busy)
    except Exception as exc:
        log.warning("could not publish cluster %s for the lab panel: %s", cluster.cluster_id, exc)


def unpublish_quietly(cluster_id: str) -> None:
    try:
        unpublish(cluster_id)
    except Exception as exc:
        log.warning("could not unpublish cluster %s: %s", cluster_id, exc)


def unpublish(cluster_id: str) -> None:
    try:
        _path(cluster_id).unlink()
    except FileNotFoundError:
        pass


def entry(cluster_id: str) -> Optional[dict[str, Any]]:
    """The published entry of ``cluster_id``, or None (not published, or unreadable)."""
    try:
        data: dict[str, Any] = json.loads(_path(cluster_id).read_text())
    except (OSError, ValueError):
        return None
    return data


def pid_alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def rank_health(rank: dict[str, Any], busy: Sequence[int] = (), dead: Optional[Sequence[int]] = None) -> str:
    """"running" (a cell) / "idle" / "exited": for ranks on this machine by their pid, for the others by the
    owner's record (``dead``: the ranks it saw end); "remote" for those when the record has no word on them."""
    if not is_local(str(rank.get("host", ""))):
        if dead is None:
            return "remote"
        if rank.get("rank") in dead:
            return "exited"
    elif not pid_alive(rank.get("pid")):
        return "exited"
    return "running" if rank.get("rank") in busy else "idle"


def alive(data: dict[str, Any], who: str = "owner") -> bool:
    """Whether the entry's owner (or ``"controller"``) still runs: its pid, with the start recorded
    when there is one (an entry from before starts were recorded: the pid alone)."""
    pid, token = data.get(f"{who}_pid"), data.get(f"{who}_start")
    if not isinstance(pid, int) or not pid_alive(pid) or not running(pid):   # a zombie holds nothing open
        return False
    return same_process(pid, token) if isinstance(token, str) else True


def _drop(path: Path, data: dict[str, Any]) -> None:
    """Remove a dead owner's entry, and its controller's key files once that is dead too."""
    path.unlink(missing_ok=True)
    cluster_id = path.stem
    if data.get("id") != cluster_id or alive(data, "controller"):
        return
    try:
        security = Path(profile_dir()) / "security"
        for key in [*security.glob(f"ipcontroller-{cluster_id}-*.json"), security / f"cluster-{cluster_id}.json"]:
            key.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("could not remove the key files of %s: %s", cluster_id, exc)


def sweep() -> list[str]:
    """Remove the entries of owners that are gone (and their dead controllers' key files); the ids removed."""
    removed = []
    base = folder()
    for path in sorted(base.glob("*.json")) if base.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and not alive(data):
            _drop(path, data)
            removed.append(path.stem)
    return removed


def published() -> list[dict[str, Any]]:
    """Every published cluster whose owner is alive; files of dead owners are removed."""
    out: list[dict[str, Any]] = []
    base = folder()
    if not base.is_dir():
        return out
    for path in sorted(base.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not alive(data):
            _drop(path, data)
            continue
        busy = data.get("busy") if isinstance(data.get("busy"), list) else []
        dead = data.get("dead") if isinstance(data.get("dead"), list) else None
        for r in data.get("ranks", []):
            r["health"] = rank_health(r, busy, dead)
            if not is_local(str(r.get("host", ""))):
                r["health_from"] = "owner"   # not looked at here: as the owning process last wrote
        out.append(data)
    return out
