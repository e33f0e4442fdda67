"""mlx_jupyter: distributed MLX, interactively.

Submodules load lazily so that the CLI and pure planners (hostfile, topology)
import quickly and work even where the native core is not built.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Buffer": "mlx_jupyter.buffers",
    "array_from_pointer": "mlx_jupyter.core.mlx_arrays",
    "Group": "mlx_jupyter.distributed",
    "init": "mlx_jupyter.distributed",
    "is_available": "mlx_jupyter.distributed",
    "backends": "mlx_jupyter.distributed",
    "Cluster": "mlx_jupyter.cluster",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mlx_jupyter' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext mlx_jupyter`: register the cluster magics."""
    from mlx_jupyter.magics import load_ipython_extension as load

    load(ipython)
