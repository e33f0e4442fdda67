"""What the server makes of one look at a cluster's ranks, whoever started it: each rank's row with
where it is and its memory (RSS and MLX's own), the headline when a rank has stalled, and a point
of the dashboard's charts.

Pure apart from the clock the caller passes: fed the status rows and the ranks' where samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from mlx_jupyter.cluster.cells.text import rank_label
from mlx_jupyter.cluster.shared import world_words
from mlx_jupyter.cluster.shared.units import format_bytes
from mlx_jupyter.server.history import ClusterHistory
from mlx_jupyter.server.stall import StallWatch
from mlx_jupyter.where import model


#: a row's state while the owner lists its rank running a cell (the registry's listing of a kernel's cluster)
LISTED_RUNNING = ("running a cell",)


@dataclass(frozen=True)
class Look:
    """What one look says: the headline ("" unless a rank stalled) and the story, the cluster's state in words."""

    headline: str
    story: str


def story(where: list[model.RankRow], shut: str = "", restart: str = "") -> str:
    """What the ranks do, in the words of the cell's table: ``running a cell on rank 0; done on rank 1``, ``idle``;
    with MLX's world shut down, that and how to get a new one (``shut``: why, :mod:`world_words`)."""
    running = [r.rank for r in where if r.state not in model.ENDED and r.state != "idle"]
    done = [r.rank for r in where if r.state == "done"]
    parts = []
    if running:
        parts.append(f"running a cell on {model.rank_words(running)}"
                     + (f"; done on {model.rank_words(done)}" if done else ""))
    elif where and all(r.state in ("idle", "done") for r in where):
        parts.append("idle")
    if shut:
        parts.append(world_words.shut_down(shut) + (f": for a new `world`, {restart}" if restart else ""))
    return "; ".join(parts)


@dataclass
class LiveState:
    """A cluster's series and its stall watch: kept between looks."""

    history: ClusterHistory = field(default_factory=ClusterHistory)   # the dashboard's charts
    stall: StallWatch = field(default_factory=StallWatch)

    def look(self, now: float, rows: list[dict[str, Any]], samples: Mapping[int, dict[str, Any]],
             say_no_reply: bool = True, restart: str = "") -> Look:
        """Fill ``rows`` (one per rank, the status's or the registry's) from ``samples`` (rank -> where
        sample; a dead rank and one that did not answer have none): ``where``, ``memory`` where the
        row has none, ``mlx_memory``; add a point to the charts; the headline ("" unless a rank stalled).
        ``say_no_reply`` False: a rank that did not answer this look keeps its row's own words (the
        owner's record of a cluster the server did not start) instead of "no reply"; ``restart``: how the
        cluster gets fresh ranks, as it works from the panel (said when MLX's world is shut down).

        A rank idle while a peer still runs the cell it ran last (their samples' cell numbers, else the owner's
        listing) has finished it: it is "done", with its last MLX calls, as
        the cell's own table says it, so the headline names the same op, number, line and culprit."""
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
        cells = {smp.get("cell") for smp in samples.values() if smp.get("running") is not False}
        listed = {int(row["rank"]) for row in rows if row.get("state") in LISTED_RUNNING}
        for r, smp in samples.items():
            if cells and r not in ended and smp.get("running") is False and (
                    smp["cell"] in cells if smp.get("cell") is not None else r in listed):
                ended[r] = "done"
        where = model.rows(samples, ended, [row["rank"] for row in rows])
        states = {row.rank: row.state for row in where}
        for row in rows:
            state = states.get(int(row["rank"]), "")
            row["where"] = "" if state == "no reply" and not say_no_reply else state
            if state == "done" and row.get("state") in LISTED_RUNNING:
                row["state"] = "done"   # the owner's listing lags: the rank finished its part of the cell
        shut = world_words.of_samples(samples, rank_label)
        return Look(self.stall.headline(now, where, samples), story(where, shut, restart))
