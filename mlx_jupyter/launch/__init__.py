"""Processes on ranks, locally or over ssh: :class:`Launcher` and the ``launch`` CLI.

What a rank itself reads (its environment's contract, its record) is the vocabulary beneath,
:mod:`mlx_jupyter.vocab`, so a rank never imports this package.
"""

from __future__ import annotations

from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.launcher import Launcher
from mlx_jupyter.vocab.rankinfo import RankInfo

__all__ = ["LaunchError", "Launcher", "RankInfo"]
