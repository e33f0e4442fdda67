"""A profiled cell's records shown under it: the timeline per rank (SVG) and the text summary."""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

from mlx_jupyter.collective.profile import OpRecord, summarize, timeline_svg


class Gathered(Protocol):
    """A cluster's profiler, as far as the view reads it."""

    @property
    def missing(self) -> Sequence[int]: ...  # ranks of the last profile that could not be asked


class Profiled(Protocol):
    """What the view reads of a cluster (:class:`mlx_jupyter.cluster.Cluster` is one)."""

    @property
    def cluster_id(self) -> str: ...
    @property
    def profiler(self) -> Gathered: ...
    def profile(self, timeout: float = 10.0) -> Mapping[int, list[OpRecord]]: ...


def show_profile(cluster: Profiled) -> None:
    """Gather the last profiled cell's records from ``cluster``'s ranks and display them."""
    from IPython.display import publish_display_data

    from mlx_jupyter.cluster.shared.errors import ClusterError

    try:
        by_rank = cluster.profile()
    except ClusterError as exc:
        print(f"mlx-jupyter: no profile: {exc}")
        return
    records = [r for rs in by_rank.values() for r in rs]
    missing = cluster.profiler.missing
    text = summarize(records).text
    if missing:
        text += f"\n(no records from rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}: dead or still busy)"
    if records:
        svg = timeline_svg(records)
        publish_display_data({"image/svg+xml": svg, "text/plain": text})  # type: ignore[no-untyped-call]  # IPython's
        print(text)
        from mlx_jupyter.cluster import last_profile

        last_profile.save(cluster.cluster_id, svg, text, list(by_rank))   # the lab dashboard shows it too
    else:
        print("mlx-jupyter profile: no collectives ran in this cell (neither our core's, through group or "
              "mlx_jupyter.distributed, nor MLX's own mx.distributed calls)")
