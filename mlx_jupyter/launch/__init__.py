"""Processes on ranks, locally or over ssh: :class:`Launcher` and the ``launch`` CLI.

Names are loaded on first use, so that a rank importing the environment contract
(:mod:`mlx_jupyter.vocab.rank_env`) does not import the launcher.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the names as the type checker sees them; at run time they load on first use
    from mlx_jupyter.launch.errors import LaunchError as LaunchError
    from mlx_jupyter.launch.launcher import Launcher as Launcher
    from mlx_jupyter.vocab.rankinfo import RankInfo as RankInfo

_NAMES = {
    "Launcher": "mlx_jupyter.launch.launcher",
    "LaunchError": "mlx_jupyter.launch.errors",
    "RankInfo": "mlx_jupyter.vocab.rankinfo",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> object:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
