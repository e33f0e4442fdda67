"""MLX ranks as ipyparallel engines: :class:`Cluster`, the ``mlx`` engine-set launcher, cells, the rank side.

Names are loaded on first use, so that a rank's engine (``mlx_jupyter.cluster.rank``)
does not import the notebook side.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "Cluster": "mlx_jupyter.cluster.cluster",
    "ClusterError": "mlx_jupyter.cluster.shared.errors",
    "ConnectedCluster": "mlx_jupyter.cluster.connected",
    "MLXEngineSetLauncher": "mlx_jupyter.cluster.engineset",
    "check_ipyparallel": "mlx_jupyter.cluster.shared.ipp_compat",
    "ipyparallel_problems": "mlx_jupyter.cluster.shared.ipp_compat",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
