"""Processes on ranks, locally or over ssh: :class:`Launcher` and the ``launch`` CLI."""

from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.launcher import Launcher
from mlx_jupyter.launch.rankinfo import RankInfo

__all__ = ["Launcher", "LaunchError", "RankInfo"]
