"""Where each rank's names came from at the last keep-state restart, as a column of the status rows.

Kept apart from :mod:`.peer_restore` (which reaches rank-side code) so that the magics and the
server can show the column without importing the restart's machinery."""

from __future__ import annotations

from typing import Any, Mapping


def status_column(cluster: object, rows: list[dict[str, Any]]) -> bool:
    """Add to each status row where its names came from at the last restart (``"restart"``);
    whether there was such a restart (a handle that restarts nothing has no ``restart_origins``)."""
    origins: Mapping[int, str] = getattr(cluster, "restart_origins", None) or {}
    for row in rows:
        if row.get("rank") in origins:
            row["restart"] = origins[row["rank"]]
    return bool(origins)
