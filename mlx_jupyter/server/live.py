"""What the server makes of one look at a cluster's ranks, whoever started it: each rank's row with
where it is and its memory (RSS and MLX's own), the headline when a rank has stalled, and a point
of the dashboard's charts.

Pure apart from the clock the caller passes: fed the status rows and the ranks' where samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from mlx_jupyter.cluster.shared.units import format_bytes
from mlx_jupyter.server.history import ClusterHistory
from mlx_jupyter.server.stall import StallWatch
from mlx_jupyter.where import model


@dataclass
class LiveState:
    """A cluster's series and its stall watch: kept between looks."""

    history: ClusterHistory = field(default_factory=ClusterHistory)   # the dashboard's charts
    stall: StallWatch = field(default_factory=StallWatch)

    def look(self, now: float, rows: list[dict[str, Any]], samples: Mapping[int, dict[str, Any]],
             say_no_reply: bool = True) -> str:
        """Fill ``rows`` (one per rank, the status's or the registry's) from ``samples`` (rank -> where
        sample; a dead rank and one that did not answer have none): ``where``, ``memory`` where the
        row has none, ``mlx_memory``; add a point to the charts; the headline ("" unless a rank stalled).
        ``say_no_reply`` False: a rank that did not answer this look keeps its row's own words (the
        owner's record of a cluster the server did not start) instead of "no reply"."""
        for row in rows:
            sample = samples.get(int(row["rank"]))
            if sample is None:
                continue
            if sample.get("rss") and not row.get("memory"):
                row.update(memory=sample["rss"], memory_text=format_bytes(sample["rss"]))
            elif not sample.get("rss") and row.get("memory"):   # the status row's where the sample has none
                sample["rss"] = row["memory"]
            if isinstance(sample.get("mlx_memory"), dict):
                row["mlx_memory"] = sample["mlx_memory"]
        self.history.add(now, samples)
        self.history.forget({int(row["rank"]) for row in rows})
        # as RankControl.where: a dead rank and one that did not answer are ended rows
        ended = {row["rank"]: "dead" for row in rows
                 if str(row.get("state", "")).startswith("dead") or row.get("health") in ("dead", "exited")}
        ended.update({row["rank"]: "no reply" for row in rows if row["rank"] not in samples and row["rank"] not in ended})
        where = model.rows(samples, ended, [row["rank"] for row in rows])
        states = {row.rank: row.state for row in where}
        for row in rows:
            state = states.get(int(row["rank"]), "")
            row["where"] = "" if state == "no reply" and not say_no_reply else state
        return self.stall.headline(now, where, samples)
