"""Small facts and settings of a rank's process: its memory, how it shows matplotlib figures."""

from __future__ import annotations

import sys
from typing import Any


def rss() -> int:
    """This process's resident memory in bytes (its peak where psutil is missing)."""
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:
        import resource

        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _figure_png(fig: Any) -> Any:
    from IPython.core.pylabtools import print_figure

    return print_figure(fig, "png")


def register_figure_png(shell: Any) -> None:
    """``display(fig)`` shows a matplotlib figure as PNG whatever the backend (Agg too).

    The inline backend registers this itself, but only once it is loaded: a rank
    that chose another backend (``matplotlib.use("Agg")``) would show only text.
    By name, so matplotlib is not imported before a cell needs it.
    """
    try:
        shell.display_formatter.formatters["image/png"].for_type_by_name("matplotlib.figure", "Figure", _figure_png)
    except Exception:  # no display formatter: nothing to show figures with anyway
        pass
