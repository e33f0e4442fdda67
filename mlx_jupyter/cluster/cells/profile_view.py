"""A profiled cell's records shown under it: the timeline per rank (SVG) and the text summary."""

from __future__ import annotations

from typing import Any

from mlx_jupyter.collective.profile import summarize, timeline_svg


def show_profile(cluster: Any) -> None:
    """Gather the last profiled cell's records from ``cluster``'s ranks and display them."""
    from IPython.display import publish_display_data

    from mlx_jupyter.cluster.shared.errors import ClusterError

    try:
        by_rank = cluster.profile()
    except ClusterError as exc:
        print(f"mlx-jupyter: no profile: {exc}")
        return
    records = [r for rs in by_rank.values() for r in rs]
    missing = getattr(cluster.profiler, "missing", [])
    text = summarize(records).text
    if missing:
        text += f"\n(no records from rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}: dead or still busy)"
    if records:
        svg = timeline_svg(records)
        publish_display_data({"image/svg+xml": svg, "text/plain": text})
        print(text)
        from mlx_jupyter.cluster import last_profile

        last_profile.save(cluster.cluster_id, svg, text, list(by_rank))   # the lab dashboard shows it too
    else:
        print("mlx-jupyter profile: no ops of our core ran in this cell (MLX's own mx.distributed calls "
              "are not recorded; use group or mlx_jupyter.distributed)")
