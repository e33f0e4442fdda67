"""Notebook widgets: `TopologyWidget` (cabling) and `ClusterStatusWidget` (ranks), front ends beside them.

Both are anywidgets: one Python class and one ES module each, no build step, and they
render in JupyterLab, Notebook 7, VS Code and anything else that runs anywidget.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ClusterStatusWidget", "TopologyWidget"]


def __getattr__(name: str) -> Any:
    if name == "TopologyWidget":
        from .topology import TopologyWidget

        return TopologyWidget
    if name == "ClusterStatusWidget":
        from .status import ClusterStatusWidget

        return ClusterStatusWidget
    raise AttributeError(f"module 'mlx_jupyter.widgets' has no attribute {name!r}")
