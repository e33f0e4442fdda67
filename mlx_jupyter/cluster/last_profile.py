"""A cluster's last ``--profile`` timeline, kept beside the registry for the lab dashboard.

The process that ran the profiled cell (the owner's kernel or a connected notebook) writes it
when it shows the profile; the server reads it for the cluster's dashboard. One small JSON file
per cluster, ``<runtime>/mlx-jupyter/profiles/<id>.json``, replaced atomically; files of clusters
no longer published are removed at the next write.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

from mlx_jupyter.cluster import registry

log = logging.getLogger("mlx_jupyter.cluster")
#: the largest timeline kept (a profile of many thousand ops draws a large SVG)
MAX_SVG = 4 * 1024 * 1024


def folder() -> Path:
    """Where the profiles live: beside the registry's cluster files."""
    return registry.folder().parent / "profiles"


def _path(cluster_id: str) -> Path:
    if not cluster_id or "/" in cluster_id or cluster_id.startswith("."):
        raise ValueError(f"bad cluster id {cluster_id!r}")
    return folder() / f"{cluster_id}.json"


def save(cluster_id: str, svg: str, summary: str, ranks: list[int]) -> None:
    """Keep ``cluster_id``'s last profile (its timeline SVG, the summary text, the ranks it covers);
    a failure is logged, never raised (the cell's output already shows the profile)."""
    try:
        path = _path(cluster_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"id": cluster_id, "time": time.time(), "ranks": sorted(ranks), "summary": summary,
                "svg": svg if len(svg) <= MAX_SVG else "", "svg_dropped": len(svg) > MAX_SVG}
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
        _sweep(keep=cluster_id)
    except Exception as exc:
        log.warning("could not keep the profile of %s for the lab dashboard: %s", cluster_id, exc)


def load(cluster_id: str) -> Optional[dict[str, Any]]:
    """``cluster_id``'s last profile as saved, or None (none recorded, or unreadable)."""
    try:
        data = json.loads(_path(cluster_id).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _sweep(keep: str) -> None:
    """Remove the profiles of clusters that are no longer published."""
    published = {p.stem for p in registry.folder().glob("*.json")}
    for path in folder().glob("*.json"):
        if path.stem != keep and path.stem not in published:
            path.unlink(missing_ok=True)
