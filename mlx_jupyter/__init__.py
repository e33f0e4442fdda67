"""mlx_jupyter: distributed MLX, interactively.

Submodules load lazily so that the CLI and pure planners (hostfile, topology)
import quickly and work even where the native core is not built.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from mlx_jupyter import _source_tree

__version__ = "0.1.0"

_TREE = Path(__file__).resolve().parent
# A checkout without its built core that shadows an installed copy (Jupyter started in the clone):
# the installed copy replaces this module in sys.modules, and the import returns it.
_source_tree.step_aside(_TREE)

_LAZY = {
    "Buffer": "mlx_jupyter.buffers",
    "array_from_pointer": "mlx_jupyter.collective.mlx_arrays",
    "Group": "mlx_jupyter.distributed",
    "init": "mlx_jupyter.distributed",
    "is_available": "mlx_jupyter.distributed",
    "backends": "mlx_jupyter.distributed",
    "Cluster": "mlx_jupyter.cluster",
    "chat": "mlx_jupyter.chatbox.widget",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "_core" and not _source_tree.core_findable():
        raise _source_tree.missing_core_error(_TREE)
    raise AttributeError(f"module 'mlx_jupyter' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext mlx_jupyter`: register the cluster magics."""
    from mlx_jupyter.magics import load_ipython_extension as load

    load(ipython)
